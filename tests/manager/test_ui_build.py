"""The web UI build at sync time: npm ci only when the lockfile changed, a build only
when the sources changed, the lockfile never modified (a fake npm records its calls;
the real one runs in every `manager test` sync, checked last)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manager import ui_build
from manager.paths import Paths

REPO = Path(__file__).resolve().parents[2]

FAKE_NPM = """
import json, os, pathlib, sys
pathlib.Path(os.environ["NPM_LOG"]).open("a").write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "ci":
    pathlib.Path("node_modules").mkdir(exist_ok=True)
    if os.environ.get("NPM_TOUCH_LOCK"):
        pathlib.Path("package-lock.json").write_text("{}")
if sys.argv[1:] == ["run", "build"]:
    pathlib.Path("dist").mkdir(exist_ok=True)
    pathlib.Path("dist/index.html").write_text("<html>")
"""


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Paths, list[str], Path]:
    shutil.copytree(REPO / "ui", tmp_path / "ui",
                    ignore=shutil.ignore_patterns("node_modules", "dist"))
    # Run through this Python rather than a `#!` line: a `#!` path cannot hold a space,
    # and the checkout (so the venv's Python) may be in a folder whose name has one.
    npm = tmp_path / "npm.py"
    npm.write_text(FAKE_NPM)
    log = tmp_path / "npm.log"
    monkeypatch.setenv("NPM_LOG", str(log))
    return Paths(tmp_path), [sys.executable, str(npm)], log


def calls(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return lines


def test_installs_and_builds_once_then_only_what_changed(checkout):
    paths, npm, log = checkout
    assert ui_build.plan(ui_build.gather(paths)).reason == "not installed yet"
    assert ui_build.ensure_built(paths, print, npm=npm) == [
        "web UI: installed its packages (npm ci)", "web UI: built ui/dist"]
    assert calls(log) == ["ci --no-audit --no-fund", "run build"]
    assert ui_build.ensure_built(paths, print, npm=npm) == []  # nothing changed
    assert calls(log) == []
    assert ui_build.state_line(ui_build.gather(paths)) == (
        True, "built, up to date with its sources")

    (paths.root / "ui" / "src" / "main.js").write_text("// edited\n")
    assert ui_build.plan(ui_build.gather(paths)).reason == "its sources changed"
    ui_build.ensure_built(paths, print, npm=npm)
    assert calls(log) == ["run build"]  # no reinstall for a source change

    lock = paths.root / "ui" / "package-lock.json"
    lock.write_text(lock.read_text().replace('"version": "0.1.0"', '"version": "0.1.1"', 1))
    assert ui_build.plan(ui_build.gather(paths)).reason == "package-lock.json changed"
    ui_build.ensure_built(paths, print, npm=npm)
    assert calls(log) == ["ci --no-audit --no-fund", "run build"]


def test_a_lockfile_changed_by_the_install_is_an_error_and_nothing_is_recorded(
        checkout, monkeypatch):
    paths, npm, log = checkout
    monkeypatch.setenv("NPM_TOUCH_LOCK", "1")
    with pytest.raises(ui_build.UiBuildError, match="package-lock.json changed"):
        ui_build.ensure_built(paths, print, npm=npm)
    assert not (paths.root / "ui" / "node_modules" / ui_build.LOCK_STAMP).exists()


def test_a_failing_npm_is_one_line_naming_the_step(checkout, tmp_path):
    paths, _npm, _log = checkout
    bad = tmp_path / "bad-npm"
    bad.write_text("#!/bin/sh\necho 'npm error network unreachable'\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(ui_build.UiBuildError, match=r"npm ci .*failed \(exit 1\): npm error "
                                                    "network unreachable"):
        ui_build.ensure_built(paths, print, npm=[str(bad)])


def test_no_ui_folder_plans_nothing(tmp_path):
    facts = ui_build.gather(Paths(tmp_path))
    assert ui_build.plan(facts).empty and ui_build.state_line(facts)[0] is False


def test_the_sync_that_ran_these_tests_left_the_lockfile_as_committed():
    """`manager test` synced first, with the real npm: if it built the UI, the committed
    lockfile must be byte for byte what it was (npm ci never rewrites it)."""
    if not (REPO / "ui" / "dist" / ui_build.BUILD_STAMP).exists():
        pytest.skip("the web UI was not built in this checkout (no node or npm registry)")
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "ui/package-lock.json"],
                             cwd=REPO)
    assert changed.returncode == 0
    facts = ui_build.gather(Paths(REPO))
    assert facts.installed_lock_hash == facts.lock_hash  # npm ci recorded this lockfile
