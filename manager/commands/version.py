"""`manager version`: toolkit version and commit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from manager import __version__, process
from manager.output import Result, render_mapping
from manager.paths import paths


def current_commit() -> str | None:
    done = process.run(["git", "rev-parse", "HEAD"], cwd=paths().root, timeout=10)
    return done.stdout.strip() if done.ok else None


def run() -> Result:
    return Result(data={"version": __version__, "commit": current_commit()})


def render(console: Console, data: Mapping[str, Any]) -> None:
    commit = data["commit"] or "unknown (not a git checkout, or git is missing)"
    render_mapping(console, {**data, "commit": commit})
