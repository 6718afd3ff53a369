"""The `flux` arch: FLUX.1 dev and schnell through diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
