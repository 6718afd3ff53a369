"""Ordered, idempotent one-time migrations (contract stub; issue 6 implements it).

The sync engine calls `run_pending` after installing; each applied id is reported through
`on_applied` only after its `run` succeeded, so the caller records it in the state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path


def pending(applied: Iterable[str]) -> list[str]:
    """Ids of the migrations not yet applied, in order."""
    return []


def run_pending(root: Path, applied: Iterable[str], on_applied: Callable[[str], None]) -> list[str]:
    """Apply pending migrations in order; return the ids applied now."""
    return []
