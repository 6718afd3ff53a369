"""run.py and `python -m aitk` under a Python that lacks the trainer's packages: one line
saying how to run it, exit 2, never a ModuleNotFoundError traceback. These run the real
entry points under a real system interpreter (skipped where none lacks torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aitk.cli import venv_check

REPO = Path(__file__).resolve().parents[2]
CONFIG = "config/examples/train_lora_example_cpu.yaml"


def _lacks_torch(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                            "sys.exit(u.find_spec('torch') is not None)"],
                           env=_clean_env(), capture_output=True)
    return probe.returncode == 0


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _system_python() -> str:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")):
        if (candidate and Path(candidate).exists()
                and Path(candidate).resolve() != Path(sys.executable).resolve()
                and _lacks_torch(candidate)):
            return candidate
    pytest.skip("no Python without torch on this machine")


@pytest.fixture(scope="module")
def system_python() -> str:
    return _system_python()


def run(python: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], cwd=cwd, env=_clean_env(), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.slow
def test_run_py_under_a_system_python_says_how_to_run_it(system_python):
    done = run(system_python, "run.py", CONFIG)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    venv_python = os.path.join(".venv", "Scripts/python.exe" if os.name == "nt"
                               else "bin/python")
    assert f"{venv_python} run.py {CONFIG}" in lines[0]
    assert f"python3 -m manager launch {CONFIG}" in lines[0]


def test_python_m_aitk_under_a_system_python_says_how_to_run_it(system_python):
    done = run(system_python, "-m", "aitk", "models")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "-m aitk models" in done.stderr


def test_without_a_venv_it_points_at_install(system_python, tmp_path):
    """A checkout where ./install.sh never ran (run.py, aitk/, no .venv)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "aitk", checkout / "aitk",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "run.py", checkout / "run.py")
    done = run(system_python, "run.py", "job.yml", cwd=checkout)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "./install.sh" in done.stderr and "no .venv" in done.stderr


def test_the_managed_environment_passes_the_check():
    assert venv_check.missing_modules() == []


def test_a_broken_managed_environment_is_told_to_sync(monkeypatch, tmp_path):
    python = venv_check.venv_python(tmp_path)
    python.parent.mkdir(parents=True)
    python.touch()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    line = venv_check.advice(["torch"], ["run.py"], ["job.yml"], root=tmp_path)
    assert "python3 -m manager sync" in line and "\n" not in line
