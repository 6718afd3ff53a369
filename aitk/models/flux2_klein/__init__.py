"""FLUX.2 [klein] (upstream archs flux2_klein_4b / flux2_klein_9b) on diffusers."""

from aitk.models.flux2_klein.model import Flux2Klein4BModel, Flux2Klein9BModel, Flux2KleinModel

__all__ = ["Flux2Klein4BModel", "Flux2Klein9BModel", "Flux2KleinModel"]
