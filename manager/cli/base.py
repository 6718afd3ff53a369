"""What every verb module shares: the app they register on, the common flags, and
`finish`, which runs a command body at the error boundary (see manager.cli).

The verb modules import this module, and manager.cli imports them: the package's
`__init__` is the only place that knows the whole command line, and nothing imports it
back (no import circle).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from manager import errors
from manager.output import Renderer, Result, emit, emit_json, envelope, stderr_console

app = typer.Typer(
    name="manager",
    help="aitk manager: install, update, check and launch the toolkit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
CpuFlag = Annotated[bool, typer.Option("--cpu", help="Accept the CPU build when no GPU is found.")]
DryRunFlag = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _finish(command: str, call: Callable[[], Result], as_json: bool,
            render: Renderer | None = None) -> None:
    """Run a command body, render its result, and turn errors into exit codes."""
    try:
        result = call()
        emit(command, result, as_json, render)
    except errors.ManagerError as exc:
        _fail(command, exc, as_json)
        raise _Exit(exc.exit_code) from None
    except _Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - the boundary: one line, the rest in a log
        failure = _unexpected(exc)
        _fail(command, failure, as_json)
        raise _Exit(failure.exit_code) from None
    raise _Exit(result.exit_code)


def _unexpected(exc: BaseException) -> errors.ManagerError:
    from manager import crash

    return crash.as_error(exc, sys.argv)


def _fail(command: str, exc: errors.ManagerError, as_json: bool) -> None:
    if as_json:
        error = {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}
        emit_json(envelope(command, None, error=error, exit_code=exc.exit_code))
    err = stderr_console()
    err.print(f"aitk: error: {exc.message}", markup=False)
    if exc.hint:
        err.print(f"aitk: hint: {exc.hint}", markup=False)
