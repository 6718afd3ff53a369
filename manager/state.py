"""Versioned manager state in .venv/aitk_manager_state.json. Loud on corruption.

The state records only what a sync verified: the spec and requirement files it installed,
the venv fingerprint it saw afterwards, and the outcome of every optional package. A
missing file is a fresh state. An unparsable one raises StateError (`read_state` instead
keeps it aside as a backup and reports it, so a sync can re-verify rather than assume).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from manager.errors import StateError
from manager.files import atomic_write_json
from manager.paths import Paths

STATE_VERSION = 1


@dataclass
class State:
    version: int = STATE_VERSION
    cpu_requested: bool = False  # `--cpu` given at install; later commands reuse it
    backend: str | None = None  # the spec's backend: cuda, rocm, mps, cpu, dgx
    installer: str | None = None  # "uv" or "pip": what the last sync used
    spec_fingerprint: str | None = None
    requirements_hash: str | None = None  # requirement files + install-relevant spec
    requirement_files: dict[str, str] = field(default_factory=dict)  # file -> sha256
    venv_fingerprint: str | None = None  # None while a sync is running or unverified
    python: dict[str, str] = field(default_factory=dict)  # {"version", "machine"}
    torch: dict[str, Any] = field(default_factory=dict)  # {"name", "version", "status"}
    git_pins: dict[str, str] = field(default_factory=dict)  # dist name -> requested rev
    companions: dict[str, dict[str, Any]] = field(default_factory=dict)
    optional: dict[str, dict[str, Any]] = field(default_factory=dict)
    migrations: list[str] = field(default_factory=list)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    verified_at: float | None = None


def _hint() -> str:
    return "run `python3 -m manager sync --verify`; it keeps the bad file aside and re-checks"


def parse_state(raw: str, where: Path) -> State:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StateError(f"{where} is corrupt ({exc.msg} at line {exc.lineno})",
                         hint=_hint()) from exc
    if not isinstance(data, dict):
        raise StateError(f"{where} is not a JSON object", hint=_hint())
    if data.get("version") != STATE_VERSION:
        raise StateError(f"{where} has an unknown format version {data.get('version')!r}",
                         hint="it was written by another version of the manager; " + _hint())
    known = {k: v for k, v in data.items() if k in State.__dataclass_fields__}
    try:
        return State(**known)
    except TypeError as exc:  # pragma: no cover - a field of the wrong shape
        raise StateError(f"{where} has an unexpected layout: {exc}", hint=_hint()) from exc


def load_state(paths: Paths) -> State:
    """A missing file is a fresh State; an unreadable or unknown one raises StateError."""
    path = paths.state_file
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return State()
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc}") from exc
    return parse_state(raw, path)


def save_state(paths: Paths, state: State) -> None:
    atomic_write_json(paths.state_file, asdict(state))


@dataclass(frozen=True)
class StateRead:
    state: State
    problem: str | None = None  # why the file on disk was not used
    backup: Path | None = None  # where the bad file was kept


def read_state(paths: Paths, keep_backup: bool) -> StateRead:
    """Like load_state, but a bad file becomes a fresh State plus a report.

    With keep_backup the bad file is renamed aside (the caller is about to write a new
    one); without it (read-only callers) nothing on disk changes.
    """
    try:
        return StateRead(load_state(paths))
    except StateError as exc:
        if not keep_backup or not paths.state_file.exists():
            return StateRead(State(), problem=exc.message)
        backup = paths.state_file.with_name(
            f"{paths.state_file.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        os.replace(paths.state_file, backup)
        return StateRead(State(), problem=exc.message, backup=backup)
