"""Which disk an installer ran out of: its output says ENOSPC -> the folder and its space.

uv and pip report a full disk as one more failed step ("Failed to download `torch`",
"Failed to extract archive", "Could not install packages due to an OSError"), which
reads like a problem with the package index; after an unreachable PyTorch index the
sync used to add that the configured indexes lack the build. When the output holds the
system's own words for a full disk, the sync names the disk instead: the folder uv's
message quotes (the file it could not write), else whichever of the places an install
writes to (the venv, the installer's cache, the temp folder) has the least room.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aitk_common.files import disk_full

# ENOSPC and EDQUOT as Linux, macOS and Windows (112) print them, in Rust's and Python's
# formats ("os error 28", "[Errno 28]").
_NO_SPACE = re.compile(r"No space left on device|\b(?:os error|Errno) (?:28|122)\b"
                       r"|Disk quota exceeded|not enough space on the disk|WinError 112",
                       re.IGNORECASE)
# The paths on the line that says so: uv quotes some in backticks and leaves others bare
# ("failed to copy file from X to Y: No space left"); the destination comes last.
_QUOTED_PATH = re.compile(r"[`'\"]((?:/|[A-Za-z]:[\\/])[^`'\"\n]+)[`'\"]")
_BARE_PATH = re.compile(r"(?:^|(?<=\s))(/[^\s`'\":]+)")


def out_of_space(output: str) -> bool:
    return bool(_NO_SPACE.search(output))


@dataclass(frozen=True)
class FullDisk:
    folder: Path  # an existing folder on the full filesystem
    role: str  # what it holds, for the message: ".venv", "the uv cache", ...


def _existing(path: Path) -> Path | None:
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return candidate
    return None


def _free(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return sys.maxsize


def _device(folder: Path) -> int | None:
    try:
        return folder.stat().st_dev
    except OSError:
        return None


def full_disk(output: str, candidates: Mapping[str, Path]) -> FullDisk:
    """The disk to name. `candidates`: role -> a folder the install writes to."""
    places = [(role, found) for role, path in candidates.items()
              if (found := _existing(Path(path))) is not None]
    for line in output.splitlines():
        if not out_of_space(line):
            continue
        named = [*_QUOTED_PATH.findall(line), *_BARE_PATH.findall(line)]
        for folder in filter(None, (_existing(Path(p)) for p in sorted(
                named, key=line.rfind, reverse=True))):
            for role, place in places:  # one of the known places, or inside one
                if place == folder or place in folder.parents:
                    return FullDisk(place, role)
            same = next((role for role, place in places
                         if _device(place) == _device(folder)), "")
            return FullDisk(folder, same)
    if not places:
        return FullDisk(Path(tempfile.gettempdir()), "the temp folder")
    role, folder = min(places, key=lambda place: _free(place[1]))
    return FullDisk(folder, role)


def cache_dir(installer: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where uv or pip keeps its cache (their documented defaults and variables)."""
    env = os.environ if environ is None else environ
    own = env.get("UV_CACHE_DIR" if installer == "uv" else "PIP_CACHE_DIR")
    if own:
        return Path(own)
    if os.name == "nt":
        base = Path(env.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "uv" / "cache" if installer == "uv" else base / "pip" / "Cache"
    if sys.platform == "darwin" and installer == "pip":
        return Path.home() / "Library" / "Caches" / "pip"
    base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / installer


def install_places(venv: Path, installer: str) -> dict[str, Path]:
    """Role -> folder for everything an install writes: the venv, the cache, temp files."""
    return {venv.name: venv, f"the {installer} cache": cache_dir(installer),
            "the temp folder": Path(tempfile.gettempdir())}


def message(what: str, where: FullDisk) -> str:
    holds = f"; it holds {where.role}" if where.role else ""
    return f"{what} failed: {disk_full(where.folder)}{holds}"


def hint(installer: str, where: FullDisk, see_output: str) -> str:
    moves = "UV_CACHE_DIR" if installer == "uv" else "PIP_CACHE_DIR"
    return (f"free some space on the disk holding {where.folder} (or point {moves} or "
            f"TMPDIR at a bigger disk), then run the sync again; {see_output}")
