"""Verbs: install, sync, test (the sync engine, issue 3)."""

from __future__ import annotations

import typer

from manager.cli import CpuFlag, _Exit, app


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def test(ctx: typer.Context, cpu: CpuFlag = False) -> None:
    """Set up the managed environment with test tools, then run pytest (args pass through)."""
    from manager.commands import test as cmd

    code = cmd.run(cmd.Options(pytest_args=tuple(ctx.args), cpu=cpu))
    raise _Exit(code)
