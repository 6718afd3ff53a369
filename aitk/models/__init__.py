"""Model archs: the BaseModel contract (base.py), the registry, the built-in archs."""
