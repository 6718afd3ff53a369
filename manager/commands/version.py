"""`manager version`: toolkit version and commit."""

from __future__ import annotations

from manager import __version__, process
from manager.output import Result
from manager.paths import paths


def current_commit() -> str | None:
    done = process.run(["git", "rev-parse", "HEAD"], cwd=paths().root, timeout=10)
    return done.stdout.strip() if done.ok else None


def run() -> Result:
    return Result(data={"version": __version__, "commit": current_commit()})
