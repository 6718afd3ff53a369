"""Verbs: doctor, launch, shortcut (issue 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from manager.cli.base import JsonFlag, _Exit, _finish, app


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check the installation and say how to fix what is wrong (exit 1 if any FAIL)."""
    from manager.commands import doctor as cmd

    _finish("doctor", lambda: cmd.run(cmd.Options()), as_json, cmd.render)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[--listen] [--port N] [--no-browser] [--allowed-host NAME] "
             "| --example | CONFIG ...")
def launch(
    ctx: typer.Context,
    listen: Annotated[bool, typer.Option(
        "--listen", help="Web UI: listen on every interface (LAN); the API needs a token.")
    ] = False,
    port: Annotated[int | None, typer.Option(
        "--port", help="Web UI: first port to try (default 8675; 0 = any free port).",
        show_default=False)] = None,
    no_browser: Annotated[bool, typer.Option(
        "--no-browser", help="Web UI: do not open a browser.")] = False,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="Web UI: also answer to this host name (repeatable; e.g. "
        "a reverse proxy's).", show_default=False)] = None,
    example: Annotated[bool, typer.Option(
        "--example", help="Run the bundled example job in this terminal.")] = False,
) -> None:
    """Without a config, serve the web UI (127.0.0.1:8675 or the next free port). With
    CONFIG... run the trainer in this terminal, like `python run.py CONFIG...` (other
    arguments go to run.py); --example runs the bundled example job. Exits with the
    server's or the trainer's code."""
    from manager.commands import launch as cmd

    options = cmd.choose(tuple(ctx.args), example=example, listen=listen, port=port,
                         no_browser=no_browser, allowed_hosts=tuple(allowed_host or ()))
    raise _Exit(cmd.run(options))


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
