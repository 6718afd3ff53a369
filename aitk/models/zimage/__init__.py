"""The `zimage` arch: Z-Image (Turbo with its training adapter, base, De-Turbo) through
diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
