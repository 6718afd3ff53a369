"""The `example` arch: a minimal DiT written for this repo (see model.py)."""

from aitk.models.example.model import ExampleModel

__all__ = ["ExampleModel"]
