"""The documentation site's generated pages and checks (``make docs``; tests/test_docs.py).

Nothing here is part of mechkit: these are the tools that keep the site true to the code.
"""
