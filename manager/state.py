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

from aitk_common.files import atomic_write_json
from manager.errors import StateError
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
    # The bad file may have been what remembered --cpu: say so, or the hint cannot work.
    return ("run `python3 -m manager sync --verify` (add --cpu if you installed with it); "
            "it keeps the bad file aside and re-checks")


def parse_state(raw: str | bytes, where: Path) -> State:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StateError(f"{where} is corrupt ({exc.msg} at line {exc.lineno})",
                         hint=_hint()) from exc
    except (ValueError, RecursionError) as exc:
        # Not UTF-8, an integer past Python's digit limit, or nesting deeper than the
        # parser's recursion: any file we cannot read is corrupt, never a crash.
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise StateError(f"{where} is corrupt ({what})", hint=_hint()) from None
    if not isinstance(data, dict):
        raise StateError(f"{where} is not a JSON object", hint=_hint())
    if data.get("version") != STATE_VERSION:
        raise StateError(f"{where} has an unknown format version {data.get('version')!r}",
                         hint="it was written by another version of the manager; " + _hint())
    known = {k: v for k, v in data.items() if k in State.__dataclass_fields__}
    for name, value in known.items():
        if not _has_shape(value, _SHAPES[name]):
            raise StateError(f"{where} has an unexpected layout ({name!r} is "
                             f"{type(value).__name__})", hint=_hint())
    return State(**known)


# Each field's JSON shape: a type, a tuple of alternatives, or a container of a shape
# (the plan calls .get() on the records: a list where a dict belongs must not get past).
_OPT_STR = (str, type(None))
_RECORDS = ("dict", dict)
_SHAPES: dict[str, Any] = {
    "version": int, "cpu_requested": bool, "backend": _OPT_STR, "installer": _OPT_STR,
    "spec_fingerprint": _OPT_STR, "requirements_hash": _OPT_STR,
    "requirement_files": ("dict", str), "venv_fingerprint": _OPT_STR,
    "python": ("dict", str), "torch": dict, "git_pins": ("dict", str),
    "companions": _RECORDS, "optional": _RECORDS, "migrations": ("list", str),
    "tools": _RECORDS, "verified_at": (int, float, type(None)),
}


def _has_shape(value: Any, shape: Any) -> bool:
    if isinstance(shape, tuple) and shape and shape[0] == "dict":
        return isinstance(value, dict) and all(_has_shape(v, shape[1]) for v in value.values())
    if isinstance(shape, tuple) and shape and shape[0] == "list":
        return isinstance(value, list) and all(_has_shape(v, shape[1]) for v in value)
    if shape is int or int in (shape if isinstance(shape, tuple) else ()):
        if isinstance(value, bool):  # JSON true is not a number here
            return False
    return isinstance(value, shape)


def load_state(paths: Paths) -> State:
    """A missing file is a fresh State; an unreadable or unknown one raises StateError."""
    path = paths.state_file
    try:
        raw = path.read_bytes()  # json decodes (and rejects) the bytes itself
    except FileNotFoundError:
        return State()
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}", hint=_hint()) from exc
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
        try:
            os.replace(paths.state_file, backup)
        except OSError as moved:  # a read-only .venv: say so; the sync fails on its write
            return StateRead(State(), problem=f"{exc.message}; it could not be set aside "
                                              f"({moved.strerror or moved})")
        return StateRead(State(), problem=exc.message, backup=backup)
