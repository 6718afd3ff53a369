"""Fixtures for the detection/spec/CLI tests of tests/manager/."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.manager.hardware_fakes import FakeMachine, install_machine


@pytest.fixture
def fake_machine(tmp_path: Path) -> Callable[[FakeMachine], dict[str, str]]:
    """Build a FakeMachine in a fresh folder; returns the env for probe / the CLI."""
    counter = iter(range(1000))

    def build(machine: FakeMachine) -> dict[str, str]:
        return install_machine(tmp_path / f"machine{next(counter)}", machine)

    return build


@dataclass(frozen=True)
class Ran:
    """What a run of the CLI gave, named as subprocess.CompletedProcess names it."""

    returncode: int
    stdout: str
    stderr: str


ManagerCli = Callable[..., Ran]


@pytest.fixture
def manager_cli(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                ) -> ManagerCli:
    """`python3 -m manager ARGS` run in this process, as the subprocess ran it.

    For tests where a subprocess adds nothing: no bootstrap or re-exec, no signal, lock
    or terminal behaviour under test. The verbs, the error boundary and the output are
    the same code; starting Python and importing typer, rich and GitPython again for
    every call was most of these tests' time. `env` replaces the whole environment for
    the call (subprocess.run's env=), `cwd` the working folder; both are restored after.
    Output is captured at the file descriptors, so what the command's own children print
    (the sync that `update` starts, git) lands in stdout/stderr as it did before; capfd
    is taken at the first call, so a test that only builds on a fixture using this one
    may still use capsys itself.
    """
    def run(*args: str, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Ran:
        from manager.cli import main

        capfd: pytest.CaptureFixture[str] = request.getfixturevalue("capfd")
        with monkeypatch.context() as scope:
            if env is not None:
                for name in list(os.environ):
                    scope.delenv(name)
                for name, value in env.items():
                    scope.setenv(name, value)
            if cwd is not None:
                scope.chdir(cwd)
            scope.setattr(sys, "argv", ["python3 -m manager", *args])  # lock notes, logs
            capfd.readouterr()  # what the test printed before is not the command's
            code = main(list(args))
            out, err = capfd.readouterr()
        return Ran(code, out, err)

    return run
