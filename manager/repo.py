"""The checkout as a git repository (GitPython): status, fetch, fast-forward only.

(Contract stub; issue 6 implements it. `check`, `update` and `doctor` use `status`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RepoStatus:
    branch: str | None  # None when HEAD is detached
    commit: str | None
    upstream: str | None  # "origin/main"; None when the branch tracks nothing
    upstream_commit: str | None = None
    behind: int | None = None  # None when unknown (remote not reached)
    ahead: int | None = None
    dirty_files: tuple[str, ...] = ()  # staged or unstaged changes to tracked files
    incoming: tuple[str, ...] = ()  # one line per incoming commit, at most 20
    remote_reached: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


def status(root: Path, fetch: bool = False, timeout: float = 20.0) -> RepoStatus:
    raise NotImplementedError
