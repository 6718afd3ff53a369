"""Fixtures for the detection/spec/CLI tests of tests/manager/."""

from __future__ import annotations

from collections.abc import Callable
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
