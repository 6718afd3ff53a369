"""The web UI's front end (`ui/`): installed and built at sync time, never at launch.

`npm ci` (a clean install that never modifies package-lock.json) runs only when the
lockfile's hash differs from the one recorded in `ui/node_modules/.aitk-lock-sha256`;
`npm run build` only when the sources' hash differs from the one recorded with the build
(`ui/dist/.build-stamp.json`). Both records are written after success only. The
lockfile's hash is checked again after the install and the build: a changed lockfile is
an error, not a silent rewrite. Built files live in `ui/dist/` (git-ignored).

Node is the checkout's (system node >= the pin's minimum, else the local copy in
`.node/`); without it, or without the npm registry, the build is a warning: the
server then shows a page saying how to build the UI.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from manager import process
from manager.paths import Paths

LOCK_STAMP = ".aitk-lock-sha256"  # in node_modules/
BUILD_STAMP = ".build-stamp.json"  # in dist/
SOURCE_FILES = ("package.json", "package-lock.json", "build.mjs")
SOURCE_DIRS = ("src",)
NPM_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class UiFacts:
    present: bool  # ui/package-lock.json exists
    lock_hash: str
    sources_hash: str
    installed_lock_hash: str | None
    built_sources_hash: str | None
    has_index: bool


@dataclass(frozen=True)
class UiPlan:
    install: bool
    build: bool
    reason: str

    @property
    def empty(self) -> bool:
        return not (self.install or self.build)


def ui_dir(paths: Paths) -> Path:
    return paths.root / "ui"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sources_hash(ui: Path) -> str:
    digest = hashlib.sha256()
    files = [ui / f for f in SOURCE_FILES] + sorted(
        p for d in SOURCE_DIRS for p in (ui / d).rglob("*") if p.is_file())
    for path in files:
        if path.is_file():
            digest.update(path.relative_to(ui).as_posix().encode() + b"\0")
            digest.update(_sha256(path.read_bytes()).encode())
    return digest.hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def gather(paths: Paths) -> UiFacts:
    ui = ui_dir(paths)
    lock = ui / "package-lock.json"
    if not lock.is_file():
        return UiFacts(False, "", "", None, None, False)
    built = None
    stamp = _read(ui / "dist" / BUILD_STAMP)
    if stamp:
        try:
            built = json.loads(stamp).get("sources")
        except ValueError:
            built = None
    return UiFacts(True, _sha256(lock.read_bytes()), sources_hash(ui),
                   _read(ui / "node_modules" / LOCK_STAMP), built,
                   (ui / "dist" / "index.html").is_file())


def plan(facts: UiFacts, force: bool = False) -> UiPlan:
    """Pure: what the sync has to do for the UI."""
    if not facts.present:
        return UiPlan(False, False, "no ui/ in this checkout")
    install = force or facts.installed_lock_hash != facts.lock_hash
    stale = facts.built_sources_hash != facts.sources_hash or not facts.has_index
    if install:
        why = "--force" if force and facts.installed_lock_hash == facts.lock_hash else (
            "not installed yet" if facts.installed_lock_hash is None
            else "package-lock.json changed")
        return UiPlan(True, True, why)
    if stale:
        return UiPlan(False, True, "not built yet" if facts.built_sources_hash is None
                      else "its sources changed")
    return UiPlan(False, False, "built and up to date")


def state_line(facts: UiFacts) -> tuple[bool, str]:
    """For doctor: (ok, detail)."""
    if not facts.present:
        return False, "no ui/ folder in this checkout"
    todo = plan(facts)
    if todo.empty:
        return True, "built, up to date with its sources"
    return False, f"needs a build: {todo.reason}"


def npm_for(node: Path) -> list[str]:
    """npm beside the node in use (the local copy's, or the system's)."""
    for name in (("npm.cmd", "npm") if os.name == "nt" else ("npm",)):
        candidate = node.parent / name
        if candidate.exists():
            return [str(candidate)]
    import shutil

    found = shutil.which("npm")
    if found is None:
        raise FileNotFoundError(f"npm is not beside {node} nor on PATH")
    return [found]


class UiBuildError(Exception):
    pass


def ensure_built(paths: Paths, report: Callable[[str], None], force: bool = False,
                 npm: list[str] | None = None) -> list[str]:
    """Install and build what the plan says; returns the changes made. Raises
    UiBuildError with a one-line reason when npm fails."""
    facts = gather(paths)
    todo = plan(facts, force)
    if todo.empty:
        return []
    ui = ui_dir(paths)
    from manager import tools

    if npm is None:
        npm = npm_for(tools.require("node", paths))
    env = process.clean_env(tools.child_env(paths))
    env.setdefault("npm_config_update_notifier", "false")
    env.setdefault("npm_config_fund", "false")
    env.setdefault("npm_config_audit", "false")
    changes = []
    if todo.install:
        report(f"web UI: npm ci ({todo.reason})")
        (ui / "node_modules" / LOCK_STAMP).unlink(missing_ok=True)
        _npm(npm, ["ci", "--no-audit", "--no-fund"], ui, env)
        _check_lock(ui, facts.lock_hash)
        (ui / "node_modules" / LOCK_STAMP).write_text(facts.lock_hash + "\n")
        changes.append("web UI: installed its packages (npm ci)")
    report("web UI: building (npm run build)" + ("" if todo.install else f": {todo.reason}"))
    _npm(npm, ["run", "build"], ui, env)
    _check_lock(ui, facts.lock_hash)
    (ui / "dist" / BUILD_STAMP).write_text(json.dumps({"sources": facts.sources_hash}) + "\n")
    changes.append("web UI: built ui/dist")
    return changes


def _npm(npm: list[str], args: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = process.run([*npm, *args], env=env, cwd=cwd, timeout=NPM_TIMEOUT_S,
                       echo=sys.stderr)
    if not done.ok:
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        why = "timed out" if done.timed_out else f"exit {done.returncode}"
        raise UiBuildError(f"npm {' '.join(args)} failed ({why}): {last}")


def _check_lock(ui: Path, expected: str) -> None:
    if _sha256((ui / "package-lock.json").read_bytes()) != expected:
        raise UiBuildError("ui/package-lock.json changed during the install or build; "
                           "restore it with `git checkout -- ui/package-lock.json`")
