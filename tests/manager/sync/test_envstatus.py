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
