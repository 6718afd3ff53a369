"""`manager info` on a fresh clone: version, commit, branch, dirty files, a remote with
its credentials redacted, library versions, backend, archs; the same block as the
`aitk_info` that training outputs record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repository holding the manager and the trainer's light parts, pushed to a bare
    remote and cloned back, as a user gets it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "AITK_"))}
    env.update({"HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"), "GIT_AUTHOR_NAME": "T",
                "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "T",
                "GIT_COMMITTER_EMAIL": "t@example.invalid", "NO_COLOR": "1"})
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("manager", "aitk_common", "aitk"):
        shutil.copytree(ROOT / part, src / part, ignore=ignore)
    for part in ("spec.py", ".gitignore", "requirements.txt"):
        shutil.copy2(ROOT / part, src / part)
    _git(src, "init", "-q", "-b", "main", env=env)
    _git(src, "add", "-A", env=env)
    _git(src, "commit", "-qm", "initial", env=env)
    bare = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", str(src), str(bare), env=env)
    work = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(bare), str(work), env=env)
    # a remote URL as some users set it, token included: never shown
    _git(work, "remote", "set-url", "origin",
         "https://someone:ghp_secret123@example.invalid/aitk.git", env=env)
    return work, env


def _info(work: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "manager", "info", "--json"], cwd=work,
                          env={**env, "AITK_ROOT": str(work), "AITK_NO_BOOTSTRAP": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["command"] == "info" and doc["ok"] is True
    return doc["data"]


def test_info_on_a_fresh_clone(clone):
    work, env = clone
    data = _info(work, env)
    assert data["commit"] == _git(work, "rev-parse", "HEAD", env=env)
    assert data["branch"] == "main" and data["dirty_files"] == []
    assert data["remote"] == "https://***@example.invalid/aitk.git"
    assert "ghp_secret123" not in json.dumps(data)
    from aitk.models import catalog

    assert data["archs"] == sorted(catalog.builtin_archs()) and "example" in data["archs"]
    from importlib import metadata

    assert data["packages"]["torch"] == metadata.version("torch")
    assert data["backend"]  # the recorded backend, or the torch build's tag
    (work / "spec.py").write_text("# edited\n")
    assert _info(work, env)["dirty_files"] == ["spec.py"]


def test_info_people_see_a_table(clone):
    work, env = clone
    done = subprocess.run([sys.executable, "-m", "manager", "info"], cwd=work,
                          env={**env, "AITK_ROOT": str(work), "AITK_NO_BOOTSTRAP": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "commit" in done.stdout and "***@" in done.stdout
    assert "ghp_secret123" not in done.stdout + done.stderr


def test_info_hides_a_token_in_the_query_too(clone):
    work, env = clone
    _git(work, "remote", "set-url", "origin",
         "https://someone:ghp_secret123@example.invalid/aitk.git?access_token=ghp_query456",
         env=env)
    data = _info(work, env)
    assert data["remote"] == "https://***@example.invalid/aitk.git?access_token=***"
    assert "ghp_query456" not in json.dumps(data)
