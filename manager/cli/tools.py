"""Verbs: tools (issue 5)."""

from __future__ import annotations

from typing import Annotated

import typer

from manager.cli.base import JsonFlag, _finish, app
from manager.output import Result


@app.command()
def tools(
    as_json: JsonFlag = False,
    provision: Annotated[
        bool,
        typer.Option("--provision", help="Install the pinned copy of each missing tool first."),
    ] = False,
) -> None:
    """Show which uv, node, ffmpeg and git are used (system or local), and their versions."""
    from manager import lock
    from manager.commands import tools as cmd
    from manager.paths import paths

    options = cmd.Options(provision=provision)

    def body() -> Result:
        if not options.provision:  # a report never waits on the lock
            return cmd.run(options)
        with lock.hold(paths(), "tools"):
            return cmd.run(options)

    _finish("tools", body, as_json, cmd.render)
