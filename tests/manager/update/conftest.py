"""Real git for the update/check tests: a bare "remote" and clones in temporary folders.

The template repository is a minimal copy of this checkout (manager/ + spec.py +
.gitignore) in which `manager/cli/env.py` is replaced by a stand-in `sync` verb. The
stand-in records how it was called and which code ran it (MARK) and applies pending
migrations the way the real sync does, so a test can prove that after a pull the NEW
code's sync ran, with every flag. Replacing env.py keeps this deterministic once the
real sync lands there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.manager.conftest import ManagerCli, Ran
from tests.manager.manager_copy import copy_manager

REPO_ROOT = Path(__file__).resolve().parents[3]
RUN_TIMEOUT = 120  # a hang fails the test instead of stalling the suite

FAKE_SYNC = '''"""Test stand-in for the sync verb (tests/manager/update/conftest.py)."""

from __future__ import annotations

import json

import typer

from manager.cli import app

MARK = "{mark}"


@app.command(context_settings={{"allow_extra_args": True, "ignore_unknown_options": True}})
def sync(ctx: typer.Context) -> None:
    from manager import migrations
    from manager.paths import paths
    from manager.state import load_state, save_state

    p = paths()
    state = load_state(p)

    def record(migration_id: str) -> None:
        state.migrations.append(migration_id)
        save_state(p, state)

    applied = []
    if "--dry-run" not in ctx.args:
        applied = migrations.run_pending(p.root, list(state.migrations), record)
    with open(p.root / "sync-calls.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({{"mark": MARK, "args": list(ctx.args), "applied": applied}}) + "\\n")
'''

UPSTREAM_MIGRATION = '''"""Test migration added upstream: proves the pulled code runs."""

ID = "900_upstream_marker"
DESCRIPTION = "test: append a line to upstream-migration-ran"


def run(root):
    with open(root / "upstream-migration-ran", "a", encoding="utf-8") as fh:
        fh.write("ran\\n")
'''


def git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GIT_", "AITK_")) and k != "PYTHONPATH"}
    env.update({
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": str(home / "gitconfig"),
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
        "AITK_NO_BOOTSTRAP": "1",
    })
    return env


def git(cwd: Path, *args: str, env: Mapping[str, str]) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=dict(env), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout


@dataclass
class Checkout:
    """A clone of `remote` (tracking origin/main), plus helpers to drive it."""

    path: Path
    remote: Path
    scratch: Path
    env: dict[str, str]
    cli: ManagerCli

    def git(self, *args: str) -> str:
        return git(self.path, *args, env=self.env)

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def manager(self, *args: str, extra_env: Mapping[str, str] | None = None) -> Ran:
        """`python -m manager ARGS` from the clone, with its environment, in this process
        (tests/manager/conftest.py: manager_cli): the verbs are this checkout's code, of
        which the clone holds a copy with a stand-in sync verb; the sync that `update`
        starts is a real process of the clone's (pulled) code, as a user's is."""
        env = {**self.env, "AITK_ROOT": str(self.path), **(extra_env or {})}
        return self.cli(*args, env=env, cwd=self.path)

    def process(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`python -m manager ARGS` as a process started in the clone, its own code."""
        return subprocess.run([sys.executable, "-m", "manager", *args], cwd=self.path,
                              env={**self.env, "AITK_ROOT": str(self.path)},
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)

    def push_upstream(self, files: Mapping[str, str | None], message: str) -> str:
        """Commit `files` (None deletes) in another clone and push; return the commit."""
        work = self.scratch / f"upstream-{len(list(self.scratch.iterdir()))}"
        git(self.scratch, "clone", "-q", str(self.remote), str(work), env=self.env)
        for name, text in files.items():
            target = work / name
            if text is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
        git(work, "add", "-A", env=self.env)
        written = [name for name, text in files.items() if text is not None]
        if written:  # upstream may ship a file in a folder users have git-ignored
            git(work, "add", "-f", "--", *written, env=self.env)
        git(work, "commit", "-q", "-m", message, env=self.env)
        git(work, "push", "-q", "origin", "HEAD:main", env=self.env)
        return git(work, "rev-parse", "HEAD", env=self.env).strip()

    def push_new_code(self) -> str:
        """Upstream: the sync's MARK becomes v2 and a new migration appears."""
        return self.push_upstream({
            "manager/cli/env.py": FAKE_SYNC.format(mark="v2"),
            "manager/migrations/m900_upstream_marker.py": UPSTREAM_MIGRATION,
        }, "upstream: new sync and a migration")

    def sync_calls(self) -> list[dict[str, object]]:
        log = self.path / "sync-calls.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    def snapshot(self) -> tuple[str, str, str, dict[str, bytes]]:
        """HEAD, `git diff`, `git diff --cached`, and the bytes of every tracked file."""
        files = {}
        for name in self.git("ls-files", "-z").split("\0"):
            if name and (self.path / name).exists():
                files[name] = (self.path / name).read_bytes()
        return (self.head(), self.git("diff", "--binary"), self.git("diff", "--cached", "--binary"),
                files)


def _copy_tree(dest: Path) -> None:
    copy_manager(dest)
    for name in (".gitignore", "pyproject.toml"):
        if (REPO_ROOT / name).exists():
            shutil.copy2(REPO_ROOT / name, dest / name)
    (dest / "manager" / "cli" / "env.py").write_text(FAKE_SYNC.format(mark="v1"),
                                                     encoding="utf-8")
    (dest / "README.md").write_text("a tracked file\n", encoding="utf-8")
    (dest / "notes.txt").write_text("another tracked file\n", encoding="utf-8")


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A bare remote holding one commit of the minimal copy; built once per session."""
    base = tmp_path_factory.mktemp("update-template")
    home = base / "home"
    home.mkdir()
    env = git_env(home)
    seed = base / "seed"
    seed.mkdir()
    _copy_tree(seed)
    git(seed, "init", "-q", "-b", "main", env=env)
    git(seed, "add", "-A", env=env)
    git(seed, "commit", "-q", "-m", "initial", env=env)
    remote = base / "remote.git"
    git(base, "clone", "-q", "--bare", str(seed), str(remote), env=env)
    return remote, env


@pytest.fixture
def checkout(template: tuple[Path, dict[str, str]], tmp_path: Path,
             manager_cli: ManagerCli) -> Iterator[Checkout]:
    template_remote, env = template
    remote = tmp_path / "remote.git"
    shutil.copytree(template_remote, remote)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(remote), str(clone), env=env)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    yield Checkout(clone, remote, scratch, dict(env), manager_cli)


@pytest.fixture
def in_checkout(checkout: Checkout, monkeypatch: pytest.MonkeyPatch) -> Checkout:
    """Point this process (in-process cli calls) at the clone, with the tests' git env."""
    for key in [k for k in os.environ if k.startswith(("GIT_", "AITK_"))]:
        monkeypatch.delenv(key)
    for key, value in checkout.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AITK_ROOT", str(checkout.path))
    return checkout
