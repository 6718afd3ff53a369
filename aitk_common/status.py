"""The trainer's status file, `status.json`: what a watcher (the web UI's server) reads
instead of parsing the console. The trainer is its one writer (aitk.run.status decides
when); `read_status` is its one reader.

    {"schema_version": 1, "pid", "name", "phase", "step", "total_steps", "loss",
     "it_per_s", "eta_s", "message", "exit_code", "error", "errors", "started", "updated",
     "val_loss", "best_val_step", "best_val_loss"}

The last three are set by a run with `train.validation_config`: the latest validation
loss and the lowest so far with its step (null otherwise).

`phase` is a Phase; the last three are final (`exit_code` set, 0 finished, 130 stopped,
anything else failed). `errors` holds a bad config's problems as data:
[{"path": "config.process[0].train.steps", "message": "..."}] ("" path: the whole
file). `started` and `updated` are Unix times. The file is replaced atomically, so a
reader never sees half of one.

`python -m aitk caption` writes the same file (when `$AITK_STATUS_FILE` is set): phase
loading, then captioning with `step`/`total_steps` counting files and `message` naming
the last one; `name` is "caption: FOLDER".

Where: `$AITK_STATUS_FILE` when set (the server gives each job its own), else
`training_folder/NAME/status.json`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from aitk_common.files import atomic_write_json

SCHEMA_VERSION = 1
FILE_NAME = "status.json"
ENV_VAR = "AITK_STATUS_FILE"


class Phase(str, Enum):
    LOADING = "loading"
    CACHING = "caching"
    TRAINING = "training"
    SAMPLING = "sampling"
    SAVING = "saving"
    CAPTIONING = "captioning"  # `python -m aitk caption`: step/total_steps count files
    # A job that does not train (extract, merge, generate) at work: `step` and
    # `total_steps` count its units (layers, files, images), `message` says what.
    WORKING = "working"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        return self in FINAL_PHASES


FINAL_PHASES = frozenset({Phase.FINISHED, Phase.STOPPED, Phase.FAILED})


def final_phase(exit_code: int) -> Phase:
    return {0: Phase.FINISHED, 130: Phase.STOPPED}.get(exit_code, Phase.FAILED)


class StatusFormatError(ValueError):
    """A file that is not a status file of a version this code reads."""


@dataclass(frozen=True)
class Problem:
    """One config problem at its field path ("" when it is about the whole file)."""

    path: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


def parse_problems(problems: Sequence[str]) -> list[Problem]:
    """Config problems ("path: message" lines) as data; a line without a path keeps an
    empty one (it is about the whole file)."""
    out = []
    for line in problems:
        path, sep, message = line.partition(": ")
        if not sep or " " in path:
            path, message = "", line
        out.append(Problem(path, message))
    return out


def problem_fields(problems: Sequence[str]) -> list[dict[str, str]]:
    """`parse_problems` in the form the file (and the web UI's API) carries."""
    return [p.to_json() for p in parse_problems(problems)]


@dataclass
class Status:
    pid: int
    name: str = ""
    phase: Phase = Phase.LOADING
    step: int = 0
    total_steps: int | None = None
    loss: float | None = None
    it_per_s: float | None = None
    eta_s: float | None = None
    message: str | None = None
    exit_code: int | None = None
    error: str | None = None
    errors: list[Problem] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    val_loss: float | None = None
    best_val_step: int | None = None
    best_val_loss: float | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for f in fields(self):
            data[f.name] = getattr(self, f.name)
        data["phase"] = self.phase.value
        data["errors"] = [p.to_json() for p in self.errors]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Status:
        """StatusFormatError unless `data` is a status object of SCHEMA_VERSION."""
        if not isinstance(data, Mapping):
            raise StatusFormatError("not a JSON object")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise StatusFormatError(f"schema_version {data.get('schema_version')!r}, "
                                    f"expected {SCHEMA_VERSION}")
        try:
            phase = Phase(data.get("phase"))
        except ValueError:
            raise StatusFormatError(f"unknown phase {data.get('phase')!r}") from None
        pid, step = data.get("pid"), data.get("step")
        if type(pid) is not int or type(step) is not int:
            raise StatusFormatError("pid and step must be integers")
        errors = data.get("errors") or []
        if not isinstance(errors, list) or not all(
                isinstance(e, Mapping) and isinstance(e.get("path"), str)
                and isinstance(e.get("message"), str) for e in errors):
            raise StatusFormatError("errors must be a list of {path, message}")
        optional = {f.name: data.get(f.name) for f in fields(cls)
                    if f.name not in ("pid", "phase", "step", "errors", "name")}
        for key, value in optional.items():
            wanted = str if key in ("message", "error") else (int, float)
            if value is not None and (isinstance(value, bool) or not isinstance(value, wanted)):
                raise StatusFormatError(f"{key} is {value!r}")
        return cls(pid=pid, name=str(data.get("name") or ""), phase=phase, step=step,
                   errors=[Problem(e["path"], e["message"]) for e in errors], **optional)


def status_path(out_dir: Path | None) -> Path | None:
    """Where a job's status goes: $AITK_STATUS_FILE, else OUT_DIR/status.json (None:
    nowhere yet)."""
    chosen = os.environ.get(ENV_VAR)
    if chosen:
        return Path(chosen)
    return out_dir / FILE_NAME if out_dir is not None else None


def write_status(path: Path, status: Status) -> None:
    """Replace the file atomically (OSError when it cannot be written)."""
    atomic_write_json(path, status.to_json())


def read_status(path: Path, max_bytes: int = 1 << 20) -> Status | None:
    """The status at `path`; None when there is none. StatusFormatError when the file
    is not a status file (or one from a newer trainer)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    if len(raw) > max_bytes:
        raise StatusFormatError(f"larger than {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise StatusFormatError(f"not JSON ({exc.__class__.__name__})") from None
    return Status.from_json(data)
