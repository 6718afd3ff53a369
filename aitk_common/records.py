"""The two records a trainer keeps while it runs, each with one writer and one reader.

    <checkout>/.aitk-run/<pid>.json   RunRecord: a training job of this checkout is
                                      running; the manager's `update` and `sync` refuse
                                      while its process lives
    <output folder>/.aitk.lock.json   LockHolder: who holds `<output folder>/.aitk.lock`,
                                      the trainer's one-per-folder lock

Each is one JSON object with a `schema_version`, written atomically by the process it
describes and removed when that process ends. A reader never trusts one alone: a crash
leaves a record behind, so the pid in a run record's file name must still be alive
(that is the caller's check); the lock itself is the OS's (filelock), the holder only
names who took it. A run record that cannot be parsed, or comes from a newer trainer,
still counts by the pid in its name: a job may be running.
"""

from __future__ import annotations

import json
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitk_common.files import atomic_write_json

SCHEMA_VERSION = 1
RUN_DIR = ".aitk-run"
LOCK_NAME = ".aitk.lock"
HOLDER_NAME = f"{LOCK_NAME}.json"
MAX_RECORD_BYTES = 64 * 1024  # a record is a few hundred bytes


def utc_now() -> str:
    """The records' time stamps: ISO 8601 UTC to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is absent, unreadable or not one."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_RECORD_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


# ---- the run record -----------------------------------------------------------------------
@dataclass(frozen=True)
class RunRecord:
    pid: int
    name: str | None = None
    config: str | None = None
    started: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "pid": self.pid, "name": self.name,
                "config": self.config, "started": self.started}

    def describe(self) -> str:
        what = self.name or self.config or "a training job"
        since = f", started {self.started}" if self.started else ""
        return f"{what} (pid {self.pid}{since})"


def run_record_path(root: Path, pid: int) -> Path:
    return root / RUN_DIR / f"{pid}.json"


def write_run_record(root: Path, record: RunRecord) -> Path:
    """Publish `record` in checkout `root`; OSError when it cannot be written."""
    path = run_record_path(root, record.pid)
    atomic_write_json(path, record.to_json())
    return path


def remove_run_record(root: Path, pid: int) -> None:
    with suppress(OSError):
        run_record_path(root, pid).unlink(missing_ok=True)


def run_record_paths(root: Path) -> list[Path]:
    """Every run record in checkout `root`, live or stale (the caller checks the pid)."""
    try:
        return sorted(p for p in (root / RUN_DIR).glob("*.json") if p.stem.isdigit())
    except OSError:
        return []


def read_run_record(path: Path) -> RunRecord | None:
    """The record at `path`; None when its name is not `<pid>.json`. The pid comes from
    the name: a damaged body, or one of a newer version, keeps only that."""
    try:
        pid = int(path.stem)
    except ValueError:
        return None
    data = _read_object(path)
    if data is None or data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        return RunRecord(pid)
    return RunRecord(pid, _text(data, "name"), _text(data, "config"),
                     _text(data, "started"))


# ---- the output folder's lock holder ----------------------------------------------------
@dataclass(frozen=True)
class LockHolder:
    pid: int
    config: str
    started: str

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "pid": self.pid, "config": self.config,
                "started": self.started}

    def describe(self) -> str:
        return f"pid {self.pid}, started {self.started}, config {self.config}"


def holder_path(out_dir: Path) -> Path:
    return out_dir / HOLDER_NAME


def write_lock_holder(out_dir: Path, holder: LockHolder) -> None:
    atomic_write_json(holder_path(out_dir), holder.to_json())


def remove_lock_holder(out_dir: Path) -> None:
    with suppress(OSError):
        holder_path(out_dir).unlink(missing_ok=True)


def read_lock_holder(out_dir: Path) -> LockHolder | None:
    """Who holds `out_dir`'s lock; None when no one says (or not in a form read here)."""
    data = _read_object(holder_path(out_dir))
    if data is None or data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        return None
    pid, config, started = data.get("pid"), data.get("config"), data.get("started")
    if type(pid) is not int or not isinstance(config, str) or not isinstance(started, str):
        return None
    return LockHolder(pid, config, started)

