"""Verbs: update, check (issue 6)."""

from __future__ import annotations

from typing import Annotated

import typer

from manager.cli.base import CpuFlag, DryRunFlag, JsonFlag, _finish, app

AutoFlag = Annotated[bool, typer.Option(
    "--auto", help="For launchers: warn instead of failing, skip the pull, still sync.")]
ForceFlag = Annotated[bool, typer.Option(
    "--force", help="Try the fast-forward despite local changes; git refuses to overwrite.")]


@app.command()
def update(auto: AutoFlag = False, force: ForceFlag = False, dry_run: DryRunFlag = False,
           cpu: CpuFlag = False) -> None:
    """Fast-forward to the upstream branch, then run the new code's sync."""
    from manager.commands import update as cmd

    options = cmd.Options(auto=auto, force=force, dry_run=dry_run, cpu=cpu)
    _finish("update", lambda: cmd.run(options), False, cmd.render)


@app.command()
def check(as_json: JsonFlag = False) -> None:
    """Say whether an update or a sync is due (exit 0 none, 10 update, 11 sync)."""
    from manager.commands import check as cmd

    _finish("check", lambda: cmd.run(cmd.Options()), as_json, cmd.render)
