"""Verbs: install, sync, test (the sync engine, issue 3).

Mutating runs hold the lock (lock.py) for the whole sync; `--dry-run` never waits for it.
`install` releases it before launching the toolkit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from manager.cli.base import CpuFlag, DryRunFlag, JsonFlag, _Exit, _finish, app
from manager.output import Result

ForceFlag = Annotated[bool, typer.Option(
    "--force", help="Reinstall the torch stack and re-run every step, whatever the state says.")]
VerifyFlag = Annotated[bool, typer.Option(
    "--verify", help="Import the torch stack to check it, even when nothing changed.")]


def _locked(command: str, dry_run: bool, call: Callable[[], Result]) -> Callable[[], Result]:
    def body() -> Result:
        if dry_run:
            return call()
        from manager import lock
        from manager.paths import paths

        argv = " ".join(sys.argv[1:]) or command
        with lock.hold(paths(), f"python3 -m manager {argv}"):
            return call()

    return body


@app.command()
def install(as_json: JsonFlag = False, cpu: CpuFlag = False, dry_run: DryRunFlag = False,
            force: ForceFlag = False, verify: VerifyFlag = False,
            no_launch: Annotated[bool, typer.Option(
                "--no-launch", help="Only install; do not start the toolkit.")] = False,
            ) -> None:
    """Install or repair .venv for this machine, then launch the toolkit."""
    from manager.commands import install as cmd

    options = cmd.Options(sync=cmd.sync.Options(cpu=cpu, dry_run=dry_run, force=force,
                                                verify=verify), launch=not no_launch)
    try:
        _finish("install", _locked("install", dry_run, lambda: cmd.run(options)), as_json,
                cmd.renderer(options.launch))
    except _Exit as done:
        if done.code != 0 or dry_run or not options.launch:
            raise
    from manager.commands import launch

    raise _Exit(launch.run(launch.Options(stdout_to_stderr=as_json)))


@app.command()
def sync(as_json: JsonFlag = False, cpu: CpuFlag = False, dry_run: DryRunFlag = False,
         force: ForceFlag = False, verify: VerifyFlag = False) -> None:
    """Bring .venv to what the spec says for this machine (fast when nothing changed)."""
    from manager.commands import sync as cmd

    options = cmd.Options(cpu=cpu, dry_run=dry_run, force=force, verify=verify)
    _finish("sync", _locked("sync", dry_run, lambda: cmd.run(options)), as_json, cmd.render)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def test(ctx: typer.Context, cpu: CpuFlag = False,
         quick: Annotated[bool, typer.Option(
             "--quick", help="Only the quick tier: leave out the tests marked slow "
                             "(trainer processes, full installs).")] = False) -> None:
    """Sync .venv (CPU build without a GPU) with test tools, then run pytest (args pass through)."""
    from manager.commands import test as cmd

    code = cmd.run(cmd.Options(pytest_args=tuple(ctx.args), cpu=cpu, quick=quick))
    raise _Exit(code)
