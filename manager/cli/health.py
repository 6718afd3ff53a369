"""Verbs: doctor, launch, shortcut (issue 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from manager.cli import JsonFlag, _Exit, _finish, app


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check the installation and say how to fix what is wrong (exit 1 if any FAIL)."""
    from manager.commands import doctor as cmd

    _finish("doctor", lambda: cmd.run(cmd.Options()), as_json, cmd.render)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[CONFIG ...] [RUN.PY OPTIONS]")
def launch(ctx: typer.Context) -> None:
    """Run the trainer on CONFIG... (default: the bundled example job) in the managed
    environment, like `python run.py CONFIG...`; exits with the trainer's code."""
    from manager.commands import launch as cmd

    raise _Exit(cmd.run(cmd.Options(configs=tuple(ctx.args))))


@app.command()
def shortcut(
    as_json: JsonFlag = False,
    desktop_dir: Annotated[
        Path | None,
        typer.Option("--desktop-dir", help="Where to put it (default: your desktop folder).",
                     show_default=False),
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Delete the shortcut.")] = False,
) -> None:
    """Put a shortcut that updates and starts the toolkit on the desktop."""
    from manager.commands import shortcut as cmd

    options = cmd.Options(desktop_dir=desktop_dir, remove=remove)
    _finish("shortcut", lambda: cmd.run(options), as_json, cmd.render)
