"""The `example` arch: a minimal DiT written for this repo.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
