"""Is the venv in sync with the spec? Fast: never imports torch.

(Contract stub: the sync engine, issue 3, implements it. `check`, `launch` and
`doctor` call `quick_status`.)
"""

from __future__ import annotations

from dataclasses import dataclass

from manager.paths import Paths


@dataclass(frozen=True)
class SyncStatus:
    in_sync: bool
    reasons: tuple[str, ...] = ()  # why not, one line each, e.g. "requirements.txt changed"


def quick_status(paths: Paths, cpu: bool | None = None) -> SyncStatus:
    """cpu=None reuses the choice recorded in the state at install time."""
    return SyncStatus(False, ("sync status is not implemented yet",))
