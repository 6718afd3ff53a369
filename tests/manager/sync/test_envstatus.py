"""quick_status: the plan's emptiness from cheap observations; never imports torch."""

from __future__ import annotations

import pytest

from manager.envstatus import quick_status
from manager.paths import paths
from tests.manager.sync.conftest import Checkout, make_spec


def test_quick_status_follows_the_venv(uv_checkout: Checkout,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, accelerators=()))
    for key, value in checkout.env.items():
        monkeypatch.setenv(key, value)
    before = quick_status(paths())
    assert not before.in_sync and any("create the virtual environment" in r
                                       for r in before.reasons)
    assert checkout.manager("sync").returncode == 0
    log = checkout.root / "imports.log"
    log.unlink()

    assert quick_status(paths()) == quick_status(paths(), cpu=True)
    assert quick_status(paths()).in_sync
    checkout.requirements("demo-req==1.0", "demo-extra==1.0")
    status = quick_status(paths())
    assert not status.in_sync
    assert any("requirements.txt changed" in r for r in status.reasons)
    assert not log.exists()  # no Python ran in the venv, so torch was never imported


def test_nothing_installed_on_a_machine_the_spec_refuses_says_install(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU and no install yet: `check` has no --cpu flag, so the reason must say what
    # to run rather than "run again with --cpu".
    from manager import errors, specsource
    from manager.envstatus import NOT_INSTALLED
    from manager.paths import Paths

    def refuse(cpu):
        raise errors.UnsupportedMachine("no supported GPU found; run again with --cpu")

    monkeypatch.setattr(specsource, "current_spec", refuse)
    status = quick_status(Paths(tmp_path))
    assert status == type(status)(False, (NOT_INSTALLED,))
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "aitk_manager_state.json").write_text('{"version": 1}')
    assert "--cpu" in quick_status(Paths(tmp_path)).reasons[0]
