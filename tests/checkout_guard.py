"""A pytest plugin: tests leave the checkout's own working folders alone.

A user's checkout holds their trainings (`output/`), caches (`cache/`), the web UI's
data (`.aitk-ui/`) and logs (`logs/`); the README's first run fills them. Tests write
to temporary folders only, so after each test module these folders are compared with
how they were before it: a file or folder created, changed or removed there fails the
module's last test (at teardown), naming what changed.

Reading them is as wrong (a test that passes or fails by what the user trained), but
cannot be seen from here; `.ci/run` runs the suite after a first run has filled them.
A trainer or the web UI started from this checkout while the tests run changes these
folders too; the failure says so. The checkout is pytest's rootdir (where
pyproject.toml is).

Loaded by tests/conftest.py; `-p tests.checkout_guard` loads it into any pytest run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

WATCHED = ("output", "cache", ".aitk-ui", "logs")

# path relative to the checkout -> (size, mtime_ns), or None for a folder
Snapshot = dict[str, "tuple[int, int] | None"]


def snapshot(root: Path, watched: tuple[str, ...] = WATCHED) -> Snapshot:
    """Every file and folder under the watched folders of `root`, with size and mtime."""
    seen: Snapshot = {}
    for name in watched:
        top = root / name
        if not top.is_dir() or top.is_symlink():
            if top.exists() or top.is_symlink():
                info = top.lstat()
                seen[name] = (info.st_size, info.st_mtime_ns)
            continue
        for folder, dirs, files in os.walk(top):
            rel = os.path.relpath(folder, root)
            seen[rel] = None
            for file in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                info = os.lstat(os.path.join(folder, file))
                seen[os.path.join(rel, file)] = (info.st_size, info.st_mtime_ns)
    return seen


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """'created PATH' / 'changed PATH' / 'removed PATH', sorted by path."""
    out = []
    for path in sorted(before.keys() | after.keys()):
        if path not in before:
            out.append(f"created {path}")
        elif path not in after:
            out.append(f"removed {path}")
        elif before[path] != after[path]:
            out.append(f"changed {path}")
    return out


class CheckoutGuard:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.before = snapshot(root)

    def check_after(self, module: str) -> None:
        after = snapshot(self.root)
        found, self.before = changes(self.before, after), after
        if found:
            shown = "\n  ".join(found[:20]) + ("\n  ..." if len(found) > 20 else "")
            pytest.fail(
                f"{module} touched the checkout's own {', '.join(WATCHED)} (tests use "
                f"tmp_path; see docs/testing.md):\n  {shown}\n(a trainer or the web UI "
                f"started from {self.root} meanwhile also does this)", pytrace=False)


_guard: CheckoutGuard | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _guard
    _guard = CheckoutGuard(session.config.rootpath)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a module's last test (trylast: its module fixtures are gone by then)."""
    if _guard is not None and (nextitem is None or nextitem.path != item.path):
        root = _guard.root
        _guard.check_after(str(item.path.relative_to(root)) if item.path.is_relative_to(root)
                           else str(item.path))
