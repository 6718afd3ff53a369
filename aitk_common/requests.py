"""Requests to a running trainer from outside it: "save now" and "sample now".

The web UI's server asks by creating an empty file named for the request (`save`,
`sample`) in the job's request folder, `$AITK_REQUEST_DIR`; the trainer takes (reads and
removes) them at its next step boundary, so a request never lands mid-step and two
clicks before the boundary are one request. Only rank 0 of a torchrun job reads the
folder; it tells the other ranks (aitk.run.process). Stdlib only: both programs import
this, and it is their one definition of the format.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

ENV_VAR = "AITK_REQUEST_DIR"


class Request(str, Enum):
    SAVE = "save"  # a checkpoint and a LoRA file at this step
    SAMPLE = "sample"  # the previews at this step


def ask(folder: Path, request: Request) -> None:
    """Leave `request` for the trainer (idempotent: asking twice is asking once)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / request.value).touch()


def pending(folder: Path) -> frozenset[Request]:
    """What is asked and not yet taken (the page shows it)."""
    return frozenset(r for r in Request if (folder / r.value).exists())


def take(folder: Path | None) -> frozenset[Request]:
    """The requests waiting in `folder`, removed as they are taken; a folder that is
    missing or unreadable holds none (a request is never a reason to stop training)."""
    if folder is None:
        return frozenset()
    taken = set()
    for request in Request:
        try:
            os.remove(folder / request.value)
        except OSError:  # not asked (the common case), or already taken
            continue
        taken.add(request)
    return frozenset(taken)


def folder_from_env() -> Path | None:
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None
