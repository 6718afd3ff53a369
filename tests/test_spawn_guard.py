"""The spawn guard (tests/spawn_guard.py): which command lines start the trainer, and a
real pytest session in which an unmarked test that starts it fails, caught or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spawn_guard import REPO, trainer_in

PY = sys.executable


@pytest.mark.parametrize("argv, cwd, found", [
    ([PY, str(REPO / "run.py"), "job.yml"], None, "run.py"),
    ([PY, "run.py", "job.yml", "--recover"], REPO, "run.py"),
    ([PY, "-X", "importtime", "-u", "run.py", "job.yml"], REPO, "run.py"),
    (["/usr/bin/python3.11", "run.py", "job.yml"], REPO, "run.py"),
    ([PY, str(REPO / "tests" / "aitk" / "paused_run.py"), "job.yml"], None,
     "tests/aitk/paused_run.py"),
    ([PY, "-m", "aitk", "run", "job.yml"], None, "-m aitk run"),
    ([PY, "-m", "aitk.cli_run", "job.yml"], None, "-m aitk.cli_run"),
    ([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "run.py"], None,
     "-m torch.distributed.run"),
    (["/venv/bin/torchrun", "--standalone", "x.py"], None, "torchrun"),
    ([PY, "-c", "from aitk.cli_run import main; main(['job.yml'])"], None,
     "python -c code that starts a run"),
    # a shell command line, the checkout's path quoted as it may hold a space
    (["sh", "-c", f'cd "{REPO}" && exec "{PY}" run.py "/tmp/my job.yml"'], REPO, "run.py"),
    (f'"{PY}" "{REPO / "run.py"}" job.yml', None, "run.py"),  # shell=True's one string
])
def test_command_lines_that_start_the_trainer(argv, cwd, found):
    assert trainer_in(argv, cwd) == found


@pytest.mark.parametrize("argv, cwd", [
    ([PY, "-m", "aitk", "models", "--json"], None),
    ([PY, str(REPO / "run.py"), "--help"], None),
    ([PY, "run.py", "job.yml", "--check"], REPO),  # the preflight only
    ([PY, "-c", "from aitk.cli_run import main; main(['job.yml', '--check'])"], None),
    ([PY, "-m", "aitk", "audit", "dataset", "d"], None),
    ([PY, "-m", "manager", "launch", "job.yml"], None),
    ([PY, "run.py", "job.yml"], "/tmp/a-stand-in-checkout"),  # not this checkout's run.py
    ([PY, "-c", "import sys; print(sys.argv)", "run.py"], "/tmp"),
    (["git", "commit", "-m", "edit run.py"], REPO),  # a word, not a file to run
    (["vermin", "--no-tips", "aitk", "run.py"], REPO),  # a file another program reads
    ([PY, "-m", "vermin", "run.py"], REPO),
    (["sh", "-c", "echo 'unbalanced"], None),
])
def test_command_lines_that_do_not(argv, cwd):
    assert trainer_in(argv, cwd) is None


TESTS = f"""
import subprocess, sys
import pytest

RUN_PY = {str(REPO / "run.py")!r}


@pytest.mark.slow
def test_marked_may_start_it():
    done = subprocess.run([sys.executable, RUN_PY], capture_output=True, text=True)
    assert "usage: python run.py" in done.stdout + done.stderr


def test_unmarked_is_refused():
    subprocess.run([sys.executable, RUN_PY, "job.yml"])


def test_unmarked_fails_even_when_the_refusal_is_caught():
    try:
        subprocess.Popen([sys.executable, "-m", "aitk", "run", "job.yml"])
    except Exception:
        pass


def test_other_processes_are_left_alone():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
"""


def test_an_unmarked_test_that_starts_the_trainer_fails(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir
    (tmp_path / "test_spawns.py").write_text(TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([PY, "-m", "pytest", "-p", "tests.spawn_guard", "-p",
                           "no:cacheprovider", "-rA", "test_spawns.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "2 failed, 2 passed" in out, out
    for name in ("test_marked_may_start_it", "test_other_processes_are_left_alone"):
        assert f"PASSED test_spawns.py::{name}" in out
    for name, what in (("test_unmarked_is_refused", "run.py"),
                       ("test_unmarked_fails_even_when_the_refusal_is_caught",
                        "-m aitk run")):
        assert f"FAILED test_spawns.py::{name}" in out
        assert (f"test_spawns.py::{name} starts the trainer ({what}) but is not marked "
                f"`slow`") in out
