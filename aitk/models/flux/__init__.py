"""The `flux` arch: FLUX.1 dev and schnell through diffusers (see model.py)."""

from aitk.models.flux.model import FluxModel

__all__ = ["FluxModel"]
