"""Verbs: version, info, detect, spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from manager.cli.base import CpuFlag, JsonFlag, _finish, app


@app.command()
def version(as_json: JsonFlag = False) -> None:
    """Print the toolkit version and commit."""
    from manager.commands import version as cmd

    _finish("version", cmd.run, as_json, cmd.render)


@app.command()
def info(as_json: JsonFlag = False) -> None:
    """Version, commit, branch, dirty files, remote, library versions, backend, archs."""
    from manager.commands import info as cmd

    _finish("info", cmd.run, as_json, cmd.render)


@app.command()
def detect(as_json: JsonFlag = False) -> None:
    """Report the hardware found and why (never fails)."""
    from manager.commands import detect as cmd

    _finish("detect", cmd.run, as_json, cmd.render)


@app.command()
def spec(
    as_json: JsonFlag = False,
    cpu: CpuFlag = False,
    from_file: Annotated[
        Path | None,
        typer.Option("--from", help="Use a `detect --json` document instead of this machine."),
    ] = None,
) -> None:
    """Print the environment spec (PyTorch build, wheels) for this machine."""
    from manager.commands import spec as cmd

    _finish("spec", lambda: cmd.run(cmd.Options(cpu=cpu, from_file=from_file)), as_json,
            cmd.render)
