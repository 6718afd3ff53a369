"""The `prx_pixel` arch: Photoroom PRXPixel (pixel-space text to image) on diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
