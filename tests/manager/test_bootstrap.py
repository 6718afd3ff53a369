"""manager/__main__.py: the stdlib bootstrap, from a Python with no packages at all."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manager import __main__ as bootstrap
from manager import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version,ok", [((3, 9, 18), False), ((3, 6, 15), False),
                                        ((3, 10, 0), True), ((3, 14, 2), True)])
def test_python_version_check(version, ok):
    message = bootstrap.python_too_old(version)
    if ok:
        assert message is None
    else:
        assert message == ("aitk: Python 3.10 or newer is required (this is "
                           + ".".join(map(str, version)) + ")")


def _old_pythons() -> list[str]:
    found = {shutil.which(f"python3.{minor}") for minor in range(6, 10)}
    found |= set(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[6-9].*/bin/python3")))
    found |= set(glob.glob(os.path.expanduser("~/.pyenv/versions/2.7.*/bin/python")))
    return sorted(p for p in found if p and "/shims/" not in p)  # pyenv shims may not run


@pytest.mark.parametrize("python", _old_pythons() or [None])
def test_old_python_gets_one_line_naming_the_version(python):
    """A real Python 2.7 or 3.6-3.9 when the machine has one (pyenv, distro packages)."""
    if python is None:
        pytest.skip("no Python older than 3.10 on this machine; the unit test above covers it")
    done = subprocess.run([python, "-m", "manager", "version"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Python 3.10 or newer is required" in lines[0]


def _site_packages(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.glob("lib/python3*/site-packages/*"))


def test_bootstrap_from_bare_python(tmp_path):
    """Copy the manager into a fresh folder and run it with a Python that has no packages:
    it must build .venv, run the command, and on the second run not reinstall."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copytree(ROOT / "manager", checkout / "manager",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "spec.py", checkout / "spec.py")
    bare = tmp_path / "bare"  # a venv without even pip: nothing importable but the stdlib
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(NO_COLOR="1", PATH=f"{bare / 'bin'}:/usr/bin:/bin")

    def manager(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, "-m", "manager", *args], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=900)

    first = manager("version")
    assert first.returncode == 0, first.stderr
    assert "0.1.0" in first.stdout
    assert "installing the manager's dependencies" in first.stderr
    # The installer's own output is in the log, the terminal keeps one line per step.
    assert "typer" in (checkout / "logs" / "bootstrap.log").read_text().lower()
    assert "typer" not in first.stderr.lower()
    assert len(first.stderr.splitlines()) <= 2, first.stderr
    marker = checkout / ".venv" / "aitk_bootstrap.txt"
    assert marker.exists()
    installed = _site_packages(checkout / ".venv")
    assert any(name.startswith("typer") for name in installed)
    stamp = marker.stat().st_mtime_ns

    second = manager("version", "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["data"]["version"] == "0.1.0"
    assert "installing" not in second.stderr and "creating" not in second.stderr
    assert marker.stat().st_mtime_ns == stamp
    assert _site_packages(checkout / ".venv") == installed

    # The "done when": detect and the CPU spec work from the bare Python.
    found = manager("detect", "--json")
    assert found.returncode == 0 and json.loads(found.stdout)["command"] == "detect"
    cpu = manager("spec", "--cpu", "--json")
    assert cpu.returncode == 0, cpu.stderr
    assert json.loads(cpu.stdout)["data"]["torch"]["local"] in ("cpu", "cu130", "cu126",
                                                                "rocm7.1", None)


@pytest.mark.parametrize("python", [sys.executable, sys._base_executable],
                         ids=["venv", "bare-reexec"])
def test_the_package_folder_runs_as_a_script_from_any_folder(python, tmp_path):
    """`python3 /path/to/checkout/manager COMMAND` from elsewhere: the checkout, not the
    package folder, goes on sys.path (manager/venv.py must not shadow the stdlib's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run([python, str(ROOT / "manager"), "version", "--json"], cwd=tmp_path,
                          env={**env, "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"]["version"] == __version__


def test_ctrl_c_while_setting_up_is_one_line_and_130(monkeypatch, capsys):
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bootstrap, "inside_venv", lambda: False)
    monkeypatch.setattr(bootstrap, "bootstrapped", lambda: False)
    monkeypatch.setattr(bootstrap, "create_venv", interrupted)
    monkeypatch.delenv("AITK_NO_BOOTSTRAP", raising=False)
    assert bootstrap.main() == 130
    err = capsys.readouterr().err
    assert err == "aitk: interrupted; run the command again to finish setting up\n"
