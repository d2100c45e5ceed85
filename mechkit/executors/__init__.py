"""Executors: where independent units of work run (serial here, Ray actors when asked)."""
