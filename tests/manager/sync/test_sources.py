"""Package sources: the PyTorch index, its override, the fallback, pip's config for uv."""

from __future__ import annotations

import json
import shutil
import subprocess

from tests.manager.sync.conftest import TORCH, Checkout, make_spec

CLOSED = "http://127.0.0.1:9/simple"  # nothing listens on the discard port


def _sync(checkout: Checkout, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    checkout.env.update(env)
    return checkout.manager("sync", "--json", *args)


def _find_links(checkout: Checkout, *names: str) -> str:
    folder = checkout.root.parent / "find-links"
    folder.mkdir(exist_ok=True)
    for name in names:
        shutil.copy2(checkout.world.wheels / name, folder / name)
    return str(folder)


def test_unreachable_torch_index_falls_back_to_the_exact_build(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    links = _find_links(checkout, "torch-2.13.0+cpu-py3-none-any.whl",
                        "torchvision-0.28.0+cpu-py3-none-any.whl")
    # The user's pip configuration file carries the find-links; uv must be given it.
    config = checkout.root.parent / "pip.conf"
    config.write_text(f"[global]\nfind-links = {links}\n")
    checkout.write_spec(make_spec(checkout.world, torch_index_url=CLOSED, accelerators=()))
    done = _sync(checkout, PIP_CONFIG_FILE=str(config))
    assert done.returncode == 0, done.stderr
    warnings = json.loads(done.stdout)["data"]["warnings"]
    assert any(f"PyTorch index {CLOSED} unreachable" in w for w in warnings)
    (log,) = (checkout.root / "logs").glob("sync-*.log")
    assert f"PyTorch index {CLOSED} cannot be reached" in log.read_text()
    # PyPI (the loopback `pypi` tree) offers torch 2.14.0 and a plain 2.13.0: only the
    # pinned build is taken.
    assert checkout.installed()["torch"] == TORCH
    assert checkout.installed()["torchvision"] == "0.28.0+cpu"
    torchaudio = checkout.state()["companions"]["torchaudio"]
    assert torchaudio["status"] == "install_failed"
    assert torchaudio["detail"] == (f"the PyTorch index {CLOSED} could not be reached, and the "
                                    "configured indexes and find-links do not have exactly "
                                    "that build")


def test_missing_build_names_the_index_and_the_override(pip_checkout: Checkout) -> None:
    checkout = pip_checkout
    spec = make_spec(checkout.world, torch_index_url=CLOSED, companions=(), accelerators=())
    checkout.write_spec(spec)
    done = _sync(checkout)
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert CLOSED in error["message"] and "torch==2.13.0+cpu" in error["message"]
    assert "AITK_TORCH_INDEX_URL" in error["hint"]
    assert "torch" not in checkout.installed()  # PyPI's 2.14.0 or 2.13.0 was not taken

    done = _sync(checkout, AITK_TORCH_INDEX_URL=checkout.world.index.pytorch)  # a mirror
    assert done.returncode == 0, done.stderr
    assert checkout.installed()["torch"] == TORCH
    assert json.loads(done.stdout)["data"]["spec"]["torch_index_url"] == \
        checkout.world.index.pytorch


def test_dry_run_on_a_fresh_checkout_changes_nothing(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    done = _sync(checkout, "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["data"]["plan"]
    assert [s["kind"] for s in plan][:3] == ["create-venv", "install-torch", "install-companion"]
    assert not checkout.venv.exists()
    assert sorted(p.name for p in checkout.root.iterdir()) == [
        "aitk_common", "dgx_requirements.txt", "manager", "requirements.txt", "spec.json",
        "spec.py"]
    human = checkout.manager("sync", "--dry-run")
    assert "Plan (" in human.stdout and "install torch==2.13.0+cpu" in human.stdout


def test_override_pypi_uses_the_configured_sources_only(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    links = _find_links(checkout, "torch-2.13.0+cpu-py3-none-any.whl")
    checkout.write_spec(make_spec(checkout.world, torch_index_url=CLOSED, companions=(),
                                  accelerators=()))
    done = _sync(checkout, AITK_TORCH_INDEX_URL="pypi", PIP_FIND_LINKS=links)
    assert done.returncode == 0, done.stderr
    assert "cannot be reached" not in done.stderr  # the spec's index is not consulted
    assert json.loads(done.stdout)["data"]["spec"]["torch_index_url"] is None
    assert checkout.installed()["torch"] == TORCH
