"""The `sd3` arch: Stable Diffusion 3.5 medium and large through diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
