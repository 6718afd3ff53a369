"""The command line: flags -> Options -> commands/<verb>.run -> Result -> output.

The verbs are registered by the modules of this package, one per area (imported at
the bottom) on the app in manager.cli.base, which holds the shared flags too.

This is the one error boundary: ManagerError subclasses become their exit code and a
one-line message (plus a hint); click's usage errors become exit 2 with one line; any
other exception (an OSError, a RecursionError, a bug) becomes exit 1 with one line that
names the log file holding its traceback (crash.py), and `--json` still gets its envelope.
Commands never print, exit or import typer.
"""

from __future__ import annotations

import sys

import click
import typer

from manager import errors
from manager.cli.base import _Exit, _fail, _finish, _unexpected, app
from manager.output import emit_json, envelope


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


__all__ = ["_finish", "app", "main"]

# Register the verbs; the import order is the order `--help` lists them.
from manager.cli import basics, env, tools, repo, health  # noqa: E402,F401,I001
