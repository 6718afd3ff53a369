"""The `flux_kontext` arch: FLUX.1 Kontext dev (image edit) through diffusers (model.py)."""

from aitk.models.flux_kontext.model import FluxKontextModel

__all__ = ["FluxKontextModel"]
