"""Versioned manager state in .venv/aitk_manager_state.json. Loud on corruption.

(Interim contract: the sync engine, issue 3, owns and extends this module; keep the
public names `State`, `load_state`, `save_state`, `STATE_VERSION`.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from manager.errors import StateError
from manager.files import atomic_write_json
from manager.paths import Paths

STATE_VERSION = 1


@dataclass
class State:
    version: int = STATE_VERSION
    cpu_requested: bool = False  # `--cpu` given at install; later commands reuse it
    backend: str | None = None
    spec_fingerprint: str | None = None
    requirements_hash: str | None = None
    venv_fingerprint: str | None = None
    git_pins: dict[str, str] = field(default_factory=dict)
    companions: dict[str, dict[str, Any]] = field(default_factory=dict)
    optional: dict[str, dict[str, Any]] = field(default_factory=dict)
    migrations: list[str] = field(default_factory=list)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_state(paths: Paths) -> State:
    """A missing file is a fresh State; an unreadable or unknown one raises StateError."""
    path = paths.state_file
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return State()
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StateError(f"{path} is corrupt ({exc.msg} at line {exc.lineno})",
                         hint="run `python3 -m manager sync --verify` to rebuild it") from exc
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise StateError(f"{path} has an unknown format version {data.get('version')!r}"
                         if isinstance(data, dict) else f"{path} is not a JSON object",
                         hint="run `python3 -m manager sync --verify` to rebuild it")
    known = {k: v for k, v in data.items() if k in State.__dataclass_fields__}
    return State(**known)


def save_state(paths: Paths, state: State) -> None:
    atomic_write_json(paths.state_file, asdict(state))
