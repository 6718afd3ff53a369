"""The code runs on the oldest supported Python (3.10, spec.py's range): vermin finds
every stdlib API, syntax or module newer than that (issue 14: hashlib.file_digest, 3.11+,
broke caching on 3.10). The stdlib-only parts' tests also run on every supported Python
found on the machine (.ci/stdlib_pythons.py, a step of .ci/run)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import spec

REPO = Path(__file__).resolve().parent.parent
OLDEST = "3.10"
CHECKED = ("manager", "aitk", "aitk_common", "spec.py", "run.py", ".ci/stdlib_pythons.py")

needs_vermin = pytest.mark.skipif(importlib.util.find_spec("vermin") is None,
                                  reason="vermin is not installed (requirements-test.txt)")


def vermin(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    # Annotations are evaluated as if at run time: `from __future__ import annotations`
    # is not everywhere, and pydantic evaluates them anyway.
    argv = [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
            f"--target={OLDEST}-", "--violations", "--no-tips", "--eval-annotations",
            "--processes=1", *map(str, paths)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_oldest_python_is_the_specs():
    # The range lives in spec.py: OLDEST follows it.
    assert f">={OLDEST}" in spec.Spec.__dataclass_fields__["python"].default


@needs_vermin
def test_code_uses_only_apis_of_the_oldest_supported_python():
    done = vermin(*CHECKED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Target versions not met" not in done.stdout


@needs_vermin
def test_the_check_finds_an_api_newer_than_the_oldest(tmp_path):
    newer = tmp_path / "digest.py"
    newer.write_text("import hashlib\n\ndef d(fh):\n"
                     "    return hashlib.file_digest(fh, 'sha256').hexdigest()\n")
    done = vermin(newer)
    assert done.returncode != 0 and "hashlib.file_digest" in done.stdout


def _load_ci_script():
    path = REPO / ".ci" / "stdlib_pythons.py"
    loaded = importlib.util.spec_from_file_location("stdlib_pythons", path)
    assert loaded and loaded.loader
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_ci_finds_each_supported_python_under_pyenv_or_on_path(tmp_path):
    ci = _load_ci_script()
    root = tmp_path / "pyenv"
    _exe(root / "versions" / "3.12.1" / "bin" / "python3.12")
    newest = _exe(root / "versions" / "3.12.10" / "bin" / "python3.12")
    _exe(root / "versions" / "3.13.0t" / "bin" / "python3.13")  # free-threaded: not taken
    on_path = _exe(tmp_path / "bin" / "python3.13")
    assert ci.find_python((3, 12), [root], str(tmp_path / "empty")) == newest
    assert ci.find_python((3, 13), [root], str(tmp_path / "bin")) == on_path
    assert ci.find_python((3, 10), [root], str(tmp_path / "empty")) is None
    assert ci.SUPPORTED[0] == tuple(map(int, OLDEST.split(".")))
    assert all((REPO / test).is_file() for test in ci.TESTS)


def test_ci_skips_the_python_the_main_suite_runs_on(tmp_path):
    ci = _load_ci_script()
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.11.7.final.0\n")
    assert ci.main_suite_version(tmp_path) == (3, 11)
    assert ci.main_suite_version(tmp_path / "none") is None


@pytest.mark.skipif(os.name == "nt", reason="POSIX paths")
def test_ci_reads_the_pytest_pin_of_the_main_suite():
    assert _load_ci_script().pinned("pytest").startswith("pytest==")
