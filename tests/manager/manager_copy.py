"""What `python3 -m manager` needs from a checkout, copied into a test's own folder."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The manager, the stdlib-only runtime it shares with the trainer and the server, and
# the spec it installs from.
PACKAGES = ("manager", "aitk_common")
FILES = ("spec.py",)


def copy_manager(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in PACKAGES:
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    for name in FILES:
        shutil.copy2(REPO / name, dest / name)
