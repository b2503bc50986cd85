"""Pages of the documentation site generated from the code (see docs/hooks/leasing_docs.py)."""
