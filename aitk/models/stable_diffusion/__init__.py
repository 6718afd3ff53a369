"""The `sd1` and `sd2` archs: Stable Diffusion 1.x and 2.x on diffusers' classes.

`arch.py` describes them without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
