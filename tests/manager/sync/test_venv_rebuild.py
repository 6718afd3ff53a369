"""A venv is built aside and swapped in (created or rebuilt for the wrong Python); its
scripts name its final path; debris is cleaned."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from manager.venv import pyvenv_version
from tests.manager.sync.conftest import TORCH, Checkout, make_spec

PY312 = Path("/root/.pyenv/versions/3.12.1/bin")


def test_wrong_python_is_rebuilt_aside(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    if not (PY312 / "python3.12").exists():
        pytest.skip("needs a second Python (3.12) to rebuild with")
    checkout.write_spec(make_spec(checkout.world, accelerators=()))
    assert checkout.manager("sync").returncode == 0
    checkout.env["PATH"] = f"{PY312}{os.pathsep}{checkout.env['PATH']}"
    checkout.write_spec(make_spec(checkout.world, accelerators=(), python="==3.12.*"))
    (checkout.root / ".venv.build").mkdir()  # debris of an interrupted rebuild
    plan = json.loads(checkout.manager("sync", "--json", "--dry-run").stdout)["data"]["plan"]
    assert plan[0]["kind"] == "rebuild-venv" and "does not satisfy ==3.12.*" in plan[0]["reason"]

    done = checkout.manager("sync", "--json")
    assert done.returncode == 0, done.stderr
    assert (pyvenv_version(checkout.venv) or "").startswith("3.12.")
    assert checkout.installed()["torch"] == TORCH
    assert checkout.run_python("import torchvision, sys; print(sys.version_info[:2])"
                               ).stdout.strip() == "(3, 12)"
    assert not (checkout.root / ".venv.build").exists()
    assert not (checkout.root / ".venv.old").exists()
    assert checkout.state()["python"]["version"].startswith("3.12")
    assert_scripts_name_the_venv(checkout)


def assert_scripts_name_the_venv(checkout: Checkout) -> None:
    """Activation scripts and console-script shebangs name .venv, not where it was built."""
    activate = (checkout.venv / "bin" / "activate").read_text()
    assert str(checkout.venv) in activate and ".venv.build" not in activate
    assert ".venv.build" not in (checkout.venv / "pyvenv.cfg").read_text()
    pip = subprocess.run([str(checkout.venv / "bin" / "pip"), "--version"], env=checkout.env,
                         capture_output=True, text=True, timeout=60)
    assert pip.returncode == 0 and str(checkout.venv) in pip.stdout, pip.stderr


def test_created_aside_and_a_venv_folder_without_python_is_replaced(checkout: Checkout
                                                                     ) -> None:
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    checkout.venv.mkdir()  # e.g. a folder left without its Python: `uv venv` refuses it
    (checkout.venv / "stray.txt").write_text("left over\n")
    done = checkout.manager("sync", "--json")
    assert done.returncode == 0, done.stderr
    assert checkout.installed()["torch"] == TORCH
    assert not (checkout.venv / "stray.txt").exists()
    assert not (checkout.root / ".venv.build").exists()
    assert_scripts_name_the_venv(checkout)


def test_a_swap_killed_between_the_renames_is_rolled_back(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    assert checkout.manager("sync").returncode == 0
    os.replace(checkout.venv, checkout.root / ".venv.old")
    done = checkout.manager("sync", "--json")
    assert done.returncode == 0, done.stderr
    assert "restored .venv" in done.stderr
    assert json.loads(done.stdout)["data"]["plan"] == []
