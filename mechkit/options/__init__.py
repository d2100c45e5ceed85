"""Plugin options declared with their types, bounds and parsers, checked before any work."""
