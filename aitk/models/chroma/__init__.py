"""The `chroma` arch: Chroma (a pruned, guidance-distilled Flux) through diffusers (model.py)."""

from aitk.models.chroma.model import ChromaModel

__all__ = ["ChromaModel"]
