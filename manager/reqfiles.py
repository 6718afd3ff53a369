"""Requirement files as plain data: their hash and their git-pinned lines."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from manager.venv import normalize


@dataclass(frozen=True)
class GitPin:
    name: str  # normalized distribution name
    line: str  # the requirement as written: "pkg @ git+https://...@rev"
    rev: str  # what follows the last "@" of the URL: a commit, tag or branch


@dataclass(frozen=True)
class ReqFile:
    name: str  # relative to the checkout: "requirements.txt"
    path: Path
    sha256: str | None  # None when the file is missing
    git_pins: tuple[GitPin, ...] = ()


def parse_git_pin(line: str) -> GitPin | None:
    """'name @ git+URL@rev' -> GitPin; anything else -> None. Markers are kept in line."""
    head, sep, url = line.partition("@")
    url = url.split(";", 1)[0].strip()
    if not sep or not url.startswith("git+"):
        return None
    name = head.split("[", 1)[0].strip()
    location = url.split("#", 1)[0]
    path_part = location.split("://", 1)[-1]
    if "@" not in path_part.split("/", 1)[-1]:
        return None  # not pinned: nothing to compare
    rev = location.rsplit("@", 1)[1]
    return GitPin(normalize(name), line, rev) if name and rev else None


def read_reqfile(root: Path, name: str) -> ReqFile:
    path = root / name
    try:
        data = path.read_bytes()
    except OSError:
        return ReqFile(name, path, None)
    pins: list[GitPin] = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        pin = parse_git_pin(line)
        if pin:
            pins.append(pin)
    return ReqFile(name, path, hashlib.sha256(data).hexdigest(), tuple(pins))
