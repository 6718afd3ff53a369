"""The real sync through uv and through pip against the loopback index."""

from __future__ import annotations

import json

from conftest import TORCH, Checkout


def sync_ok(checkout: Checkout, *args: str) -> dict:
    done = checkout.manager("sync", "--json", *args)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def test_fresh_install_then_noop(checkout: Checkout) -> None:
    env = sync_ok(checkout)
    installed = checkout.installed()
    assert installed["torch"] == TORCH
    assert installed["torchvision"] == "0.28.0+cpu"
    assert "torchaudio" not in installed  # never imports: removed and recorded
    assert installed["demo-req"] == "1.0"
    assert installed["accel-good"] == "1.0"
    assert "accel-broken" not in installed and "accel-broken-dep" not in installed
    state = checkout.state()
    assert state["installer"] == env["data"]["installer"]
    assert state["torch"]["status"] == "ok"
    assert state["companions"]["torchvision"]["status"] == "ok"
    assert state["companions"]["torchaudio"]["status"] == "removed"
    statuses = {k: v["status"] for k, v in state["optional"].items()}
    assert statuses == {"accel-good": "ok", "accel-broken": "rolled_back",
                        "accel-uninstallable": "install_failed", "accel-nowheel": "unavailable"}
    assert state["git_pins"] == {"gitpkg": checkout.world.git_revs[0]}
    assert checkout.run_python("import gitpkg; print(gitpkg.VALUE)").stdout.strip() == "1"

    (checkout.root / "imports.log").unlink()
    again = sync_ok(checkout)
    assert again["data"]["plan"] == [] and again["data"]["changes"] == []
    assert checkout.state() == state
    assert not (checkout.root / "imports.log").exists()  # a no-op never imports torch
