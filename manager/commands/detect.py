"""`manager detect`: placeholder until detect.py lands."""
