"""FLUX.2 [klein] (archs flux2_klein_4b / flux2_klein_9b / flux2_klein) on diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
