"""The `flux_kontext` arch: FLUX.1 Kontext dev (image edit) through diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
