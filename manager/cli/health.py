"""Verbs: doctor, launch, shortcut (issue 7)."""

from __future__ import annotations

from manager.cli import app  # noqa: F401
