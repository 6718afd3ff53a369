"""The real configs the tests and benchmarks build parts from: each arch folder's
`real_parts.py`, merged (aitk.models.real_parts says how they are kept and checked)."""

from __future__ import annotations

from aitk.models.real_parts import RealPart, build, kept, real_parts

REAL_PARTS = real_parts()

__all__ = ["REAL_PARTS", "RealPart", "build", "kept"]
