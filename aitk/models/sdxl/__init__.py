"""The `sdxl` arch: Stable Diffusion XL on diffusers' classes.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
