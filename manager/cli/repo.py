"""Verbs: update, check (issue 6)."""

from __future__ import annotations

from manager.cli import app  # noqa: F401
