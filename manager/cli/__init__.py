"""The command line: flags -> Options -> commands/<verb>.run -> Result -> output.

The verbs are registered by the modules of this package, one per area (imported at
the bottom); this module holds the app and the shared flags.

This is the one error boundary: ManagerError subclasses become their exit code and a
one-line message (plus a hint); click's usage errors become exit 2 with one line; any
other exception (an OSError, a RecursionError, a bug) becomes exit 1 with one line that
names the log file holding its traceback (crash.py), and `--json` still gets its envelope.
Commands never print, exit or import typer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import click
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="python3 -m manager", standalone_mode=False)
        if code == errors.EXIT_INTERRUPTED:  # typer turns Ctrl+C into a returned 130
            sys.stderr.write("aitk: interrupted\n")
            return code
    except _Exit as done:
        return done.code
    except click.exceptions.NoArgsIsHelpError as exc:
        # click's `no_args_is_help` raises this after formatting the help.
        sys.stdout.write(exc.ctx.get_help() + "\n")
        return 0
    except click.exceptions.UsageError as exc:
        verb = _verb(command, exc.ctx, args)
        hint = f"see `python3 -m manager{' ' + verb.name if verb else ''} --help`"
        if verb is not None and "--json" in args and _takes_json(verb):
            # Scripts parse stdout even when they get the call wrong.
            error = {"type": "UsageError", "message": exc.format_message(), "hint": hint}
            emit_json(envelope(verb.name or "", None, error=error,
                               exit_code=errors.UsageError.exit_code))
        sys.stderr.write(f"aitk: usage error: {exc.format_message()} ({hint})\n")
        return errors.UsageError.exit_code
    except errors.ManagerError as exc:  # raised outside _finish (e.g. `test`)
        _fail("", exc, as_json=False)
        return exc.exit_code
    except click.exceptions.Abort:
        sys.stderr.write("aitk: interrupted\n")
        return errors.EXIT_INTERRUPTED
    except KeyboardInterrupt:
        sys.stderr.write("aitk: interrupted\n")
        return errors.EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - raised outside _finish (e.g. `test`)
        failure = _unexpected(exc)
        _fail("", failure, as_json=False)
        return failure.exit_code
    return 0


def _verb(group: click.Command, ctx: click.Context | None,
          args: list[str]) -> click.Command | None:
    """The verb a usage error is about. click gives no context for some errors (an option
    missing its value), so the verb is then the first argument, if it names one."""
    if ctx is not None and ctx.parent is not None:
        return ctx.command
    verbs = getattr(group, "commands", {})
    return verbs.get(args[0]) if args else None


def _takes_json(verb: click.Command) -> bool:
    return any("--json" in getattr(p, "opts", ()) for p in verb.params)


# Register the verbs; the import order is the order `--help` lists them.
from manager.cli import basics, env, tools, repo, health  # noqa: E402,F401,I001
