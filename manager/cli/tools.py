"""Verbs: tools (issue 5)."""

from __future__ import annotations

from manager.cli import app  # noqa: F401
