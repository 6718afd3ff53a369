"""Output is a contract: `--json` prints one versioned envelope on stdout and nothing
else; people get rich text on stdout, and progress and notes on stderr.

Commands return a Result and never print; cli.py hands it to `emit`. rich loads only
when something is drawn: the envelope and plain lines need none of it (a no-op sync
answers before the command line loads, manager/noop_sync.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Result:
    """What a command did: machine data, notes for people, and the exit code."""

    data: Mapping[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    messages: tuple[str, ...] = ()


Renderer = Callable[["Console", Mapping[str, Any]], None]


def _no_color() -> bool:
    # no-color.org: set to a non-empty value (an empty NO_COLOR= means "not set").
    return os.environ.get("NO_COLOR", "") != ""


def stdout_console() -> Console:
    from rich.console import Console

    return Console(no_color=_no_color(), soft_wrap=True, highlight=False)


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, no_color=_no_color(), soft_wrap=True, highlight=False)


def envelope(command: str, result: Result | None, error: Mapping[str, Any] | None = None,
             exit_code: int | None = None) -> dict[str, Any]:
    code = exit_code if exit_code is not None else (result.exit_code if result else 1)
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "ok": error is None and code == 0,
        "exit_code": code,
        "data": dict(result.data) if result else {},
        "messages": list(result.messages) if result else [],
        "error": dict(error) if error else None,
    }


def json_text(payload: Mapping[str, Any]) -> str:
    """The envelope as printed: what emit_json writes (and the no-op memo keeps)."""
    return json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n"


def emit_json(payload: Mapping[str, Any]) -> None:
    sys.stdout.write(json_text(payload))
    sys.stdout.flush()


def emit(command: str, result: Result, as_json: bool, render: Renderer | None = None) -> None:
    if as_json:
        emit_json(envelope(command, result))
        return
    console = stdout_console()
    (render or render_mapping)(console, result.data)
    err = stderr_console()
    for message in result.messages:
        err.print(message, markup=False)


def render_mapping(console: Console, data: Mapping[str, Any]) -> None:
    """Fallback rendering: one key per row, nested values as compact JSON."""
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in data.items():
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        table.add_row(str(key), shown)
    console.print(table)
