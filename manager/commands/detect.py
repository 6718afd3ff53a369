"""`manager detect` (issue 2)."""
