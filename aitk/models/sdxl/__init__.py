"""The `sdxl` arch: Stable Diffusion XL on diffusers' classes (see model.py)."""

from aitk.models.sdxl.model import SDXLModel

__all__ = ["SDXLModel"]
