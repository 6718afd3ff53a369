"""The managed virtual environment: what is in it (cheaply), and building it safely.

`observe` reads only directory listings and a few small files, never imports anything
in the venv: it is what a no-op sync and `check` pay. The fingerprint changes whenever a
distribution is installed, removed or reinstalled (pip and uv rewrite its .dist-info).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aitk_common.files import atomic_write_bytes
from manager.paths import Paths

_NORMALIZE = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return _NORMALIZE.sub("-", name).lower()


@dataclass(frozen=True)
class Dist:
    name: str  # normalized
    version: str
    path: Path  # the .dist-info folder
    direct_url: Mapping[str, object] | None = None  # PEP 610, for VCS/URL installs

    @property
    def vcs_revision(self) -> str | None:
        info = (self.direct_url or {}).get("vcs_info")
        if isinstance(info, dict):
            rev = info.get("requested_revision") or info.get("commit_id")
            return str(rev) if rev else None
        return None


@dataclass(frozen=True)
class Observed:
    exists: bool
    python_version: str | None = None  # from pyvenv.cfg
    dists: Mapping[str, Dist] = field(default_factory=dict)
    fingerprint: str | None = None
    site_packages: Path | None = None


def pyvenv_version(venv: Path) -> str | None:
    try:
        text = (venv / "pyvenv.cfg").read_text(encoding="utf-8")
    except OSError:
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip().lower()] = value.strip()
    # venv writes `version`, uv writes `version_info`
    return found.get("version_info") or found.get("version")


def site_packages(venv: Path) -> Path | None:
    if os.name == "nt":
        path = venv / "Lib" / "site-packages"
        return path if path.is_dir() else None
    lib = venv / "lib"
    try:
        candidates = sorted(p for p in lib.iterdir() if p.name.startswith("python"))
    except OSError:
        return None
    for candidate in candidates:
        if (candidate / "site-packages").is_dir():
            return candidate / "site-packages"
    return None


def _read_direct_url(dist_info: Path) -> Mapping[str, object] | None:
    try:
        data = json.loads((dist_info / "direct_url.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def observe(paths: Paths) -> Observed:
    python = paths.venv_python
    if not python.exists():
        return Observed(exists=False)
    version = pyvenv_version(paths.venv)
    sp = site_packages(paths.venv)
    if sp is None:
        return Observed(exists=True, python_version=version)
    digest = hashlib.sha256(f"python={version}\n".encode())
    dists: dict[str, Dist] = {}
    with os.scandir(sp) as entries:
        listing = sorted(entries, key=lambda e: e.name)
    for entry in listing:
        if entry.name.endswith(".dist-info"):
            stem = entry.name[: -len(".dist-info")]
            name, _, ver = stem.partition("-")
            dist_path = Path(entry.path)
            direct = (_read_direct_url(dist_path)
                      if (dist_path / "direct_url.json").exists() else None)
            dists[normalize(name)] = Dist(normalize(name), ver, dist_path, direct)
        elif not entry.name.endswith(".pth"):
            continue
        digest.update(f"{entry.name} {entry.stat().st_mtime_ns}\n".encode())
    return Observed(True, version, dists, digest.hexdigest(), sp)


def incomplete_dists(observed: Observed) -> list[str]:
    """Distributions whose RECORD lists files that are gone (an interrupted install)."""
    broken: list[str] = []
    if observed.site_packages is None:
        return broken
    for dist in observed.dists.values():
        try:
            record = (dist.path / "RECORD").read_text(encoding="utf-8")
        except OSError:
            broken.append(dist.name)
            continue
        for line in record.splitlines():
            rel = line.split(",", 1)[0]
            if rel and not (observed.site_packages / rel).exists():
                broken.append(dist.name)
                break
    return broken


def stray_install_leftovers(observed: Observed) -> list[Path]:
    """Folders pip renames to `~name` while replacing a package; left by a kill."""
    if observed.site_packages is None:
        return []
    return [p for p in observed.site_packages.iterdir() if p.name.startswith("~")]


def build_aside(paths: Paths) -> Path:
    return paths.venv.with_name(paths.venv.name + ".build")


def retired(paths: Paths) -> Path:
    return paths.venv.with_name(paths.venv.name + ".old")


def swap_leftovers(paths: Paths) -> list[Path]:
    """What an interrupted rebuild left (recover_interrupted_swap cleans it up)."""
    return [p for p in (build_aside(paths), retired(paths)) if os.path.lexists(p)]


def restore_retired(paths: Paths) -> str | None:
    """Killed between swap_in's two renames: no .venv, the previous one is .venv.old. Put
    it back (the bootstrap asks first: a new .venv built there would pass for the finished
    swap, and the sync would delete the good one as debris). Returns the note, if any."""
    old = retired(paths)
    if os.path.lexists(paths.venv) or not old.is_dir():
        return None
    os.replace(old, paths.venv)
    return f"restored {paths.venv.name} from an interrupted rebuild"


def recover_interrupted_swap(paths: Paths) -> list[str]:
    """Undo what an interrupted rebuild left: finish or roll back the swap, drop debris."""
    notes: list[str] = []
    old, build = retired(paths), build_aside(paths)
    if restored := restore_retired(paths):
        notes.append(restored)
    for leftover in (build, old):
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)
            notes.append(f"removed {leftover.name} left by an interrupted rebuild")
    return notes


def retarget_scripts(build: Path, final: Path) -> list[Path]:
    """Point a venv built at `build` at the path it is about to be renamed to.

    venv and uv write the venv's own path into the activation scripts, the shebangs of
    console scripts (pip, and anything installed before the swap) and pyvenv.cfg; after the
    rename they would name a folder that no longer exists. Text files only: a binary
    launcher (Windows .exe) cannot be edited in place and is rewritten by its next install.
    """
    scripts = build / ("Scripts" if os.name == "nt" else "bin")
    old, new = str(build).encode(), str(final).encode()
    changed: list[Path] = []
    try:
        entries = [p for p in scripts.iterdir() if p.is_file() and not p.is_symlink()]
    except OSError:
        return changed
    entries.append(build / "pyvenv.cfg")  # venv records the command that made it
    for path in entries:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data or old not in data:
            continue
        # Keep each script's own mode (executable), not the umask's default.
        atomic_write_bytes(path, data.replace(old, new), mode=path.stat().st_mode & 0o7777)
        changed.append(path)
    return changed


def swap_in(paths: Paths) -> None:
    """Replace .venv by the finished .venv.build with two renames."""
    old, build = retired(paths), build_aside(paths)
    if paths.venv.exists():
        os.replace(paths.venv, old)
    os.replace(build, paths.venv)
    shutil.rmtree(old, ignore_errors=True)
