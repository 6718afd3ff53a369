"""The torch guard: a disturbed stack is repaired by a forced reinstall."""

from __future__ import annotations

import json
import subprocess

from tests.manager.sync.conftest import TORCH, Checkout, make_spec


def _sync(checkout: Checkout, *args: str) -> subprocess.CompletedProcess[str]:
    return checkout.manager("sync", "--json", *args)


def test_broken_companion_is_repaired_by_verify(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, accelerators=()))
    assert _sync(checkout).returncode == 0
    init = next((checkout.venv / "lib").glob("python3*/site-packages/torchvision/__init__.py"))
    good = init.read_text()
    init.write_text("raise ImportError('deliberately broken')\n")
    assert "deliberately" in checkout.run_python("import torchvision").stderr

    done = _sync(checkout, "--verify")
    assert done.returncode == 0, done.stderr
    assert init.read_text() == good  # the files were really replaced
    assert checkout.run_python("import torchvision").returncode == 0
    result = json.loads(done.stdout)["data"]
    assert "repaired torchvision 0.28.0+cpu" in result["changes"]
    assert checkout.state()["companions"]["torchvision"]["status"] == "ok"


def test_torch_swapped_behind_our_back_is_restored(pip_checkout: Checkout) -> None:
    checkout = pip_checkout
    checkout.write_spec(make_spec(checkout.world, accelerators=()))
    assert _sync(checkout).returncode == 0
    # An unrelated install pulls PyPI's torch over the pinned build.
    swap = subprocess.run([str(checkout.python), "-m", "pip", "install", "-q", "--no-deps",
                           "torch==2.14.0"], env={k: v for k, v in checkout.env.items()
                                                  if k not in {"PIP_TARGET", "PIP_USER"}},
                          capture_output=True, text=True)
    assert swap.returncode == 0, swap.stderr
    assert checkout.installed()["torch"] == "2.14.0"

    plan = json.loads(_sync(checkout, "--dry-run").stdout)["data"]["plan"]
    assert plan[0]["kind"] == "install-torch" and plan[0]["force"]
    done = _sync(checkout)
    assert done.returncode == 0, done.stderr
    assert checkout.installed()["torch"] == TORCH
    assert checkout.run_python("import torchvision").returncode == 0


def test_a_requirement_cannot_swap_torch(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    checkout.requirements("demo-req==1.0", "needs-newer-torch==1.0")
    done = _sync(checkout)
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert "installing requirements.txt failed" in error["message"]
    assert checkout.installed()["torch"] == TORCH  # the constraints file held
    assert checkout.state()["venv_fingerprint"] is None  # nothing unverified recorded
