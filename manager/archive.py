"""The one installer of archives: safe extraction, staging, atomic publish, markers.

Extraction checks every member before writing anything: no absolute paths or drive
letters, no `..`, no links that resolve outside the tree, no devices or fifos, and an
unpacked-size ceiling (a small archive can expand without bound).

An install is staged in the checkout's `.aitk-staging/` (same filesystem as the target,
so the final step is a rename), with its marker written inside the staged tree; then
the old copy is renamed aside, the new one renamed into place, and only then is the old
one deleted. A crash between the two renames leaves the old copy in staging, and
`recover` puts it back. A copy whose marker is missing or names another tool, version,
artefact or checksum is not trusted (`read_marker` + `marker_matches`).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aitk_common.files import atomic_write_json, fsync_dir
from manager.errors import ManagerError

if TYPE_CHECKING:  # the archive formats load when something is extracted: reading a
    import tarfile  # marker (is the local copy the pinned one?) stays cheap
    import zipfile

MARKER_NAME = ".aitk-tool.json"
STAGING_DIR = ".aitk-staging"
MARKER_FORMAT = 1


class UnsafeArchive(ManagerError):
    """An archive member would land outside the target or is not a plain file/dir/link."""


@dataclass(frozen=True)
class Marker:
    tool: str
    version: str
    artefact: str  # file name of what was downloaded
    source: str  # the URL it came from (a mirror's, when one was used)
    sha256: str  # digest of the downloaded file
    verified: bool  # False only after the user's explicit opt-in to an unverified file
    format: int = MARKER_FORMAT


def write_marker(folder: Path, marker: Marker) -> None:
    atomic_write_json(folder / MARKER_NAME, asdict(marker))


def read_marker(folder: Path) -> Marker | None:
    """The marker of a local copy, or None when it is missing or unreadable."""
    try:
        data = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
        return Marker(**data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError, RecursionError):
        return None


def marker_matches(marker: Marker | None, tool: str, version: str, artefact: str,
                   sha256: str | None) -> bool:
    """Pure: is this the copy the pins ask for? (sha256=None: the pin has no fixed digest,
    e.g. Node's comes from the vendor's list at download time.)"""
    if marker is None or marker.format != MARKER_FORMAT:
        return False
    same = (marker.tool, marker.version, marker.artefact) == (tool, version, artefact)
    return same and (sha256 is None or marker.sha256 == sha256.lower())


# ---- member checks (pure) ----------------------------------------------------------------


def unsafe_name(name: str) -> str | None:
    """Why an archive member's name is unsafe, or None. Names use `/` (tar and zip)."""
    if not name or "\x00" in name:
        return "an empty or NUL-containing name"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a `..` component"
    return None


def unsafe_link(name: str, target: str) -> str | None:
    """Why a symlink `name -> target` is unsafe (points outside the tree), or None."""
    if not target or target.startswith(("/", "\\")) or (len(target) > 1 and target[1] == ":"):
        return f"a link to an absolute path ({target})"
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if joined == ".." or joined.startswith("../"):
        return f"a link that points outside the target ({target})"
    return None


def _resolve(parts: list[str], links: dict[str, str]) -> list[str] | None:
    """A path inside the archive, following the archive's own symlinks, as its parts;
    None when it climbs above the root (or the links loop)."""
    out: list[str] = []
    todo = list(parts)
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        target = links.get("/".join(out))
        if target is not None:
            hops += 1
            if hops > 64:
                return None
            out.pop()
            todo = target.split("/") + todo
    return out


def link_escape(members: list[tuple[str, str | None]]) -> str | None:
    """Pure: the first member that reaches outside the tree through the archive's own
    links, or None. `unsafe_link` judges one link by its text; this follows chains, e.g.
    `a -> .` then `b -> a/../..`, whose text stays inside while the path does not."""
    links = {n.strip("/"): t for n, t in members if t is not None}
    for name, target in members:
        parts = name.strip("/").split("/")
        if target is not None and _resolve(parts[:-1] + target.split("/"), links) is None:
            return name
        if _resolve(parts[:-1], links) is None:  # written through a link to outside
            return name
    return None


def _refuse(name: str, problem: str) -> UnsafeArchive:
    return UnsafeArchive(f"archive member {name!r} is {problem}; nothing was installed",
                         hint="the download is not the expected release; check the URL or "
                              "mirror")


def _check_tar(members: list[tarfile.TarInfo], max_unpacked: int) -> None:
    total = 0
    for m in members:
        problem = unsafe_name(m.name)
        if problem is None and m.issym():
            problem = unsafe_link(m.name, m.linkname)
        elif problem is None and m.islnk():  # hard links name another member
            problem = unsafe_name(m.linkname)
        elif problem is None and not (m.isfile() or m.isdir()):
            problem = "a device, fifo or other special file"
        if problem:
            raise UnsafeArchive(f"archive member {m.name!r} is {problem}; nothing was installed",
                                hint="the download is not the expected release; "
                                     "check the URL or mirror")
        total += m.size
        if total > max_unpacked:
            raise UnsafeArchive(f"archive unpacks to more than {max_unpacked} bytes")
    escaping = link_escape([(m.name, m.linkname if m.issym() else None) for m in members])
    if escaping:
        raise _refuse(escaping, "reached outside the target through a chain of links")


def _zip_mode(info: zipfile.ZipInfo) -> int:
    return info.external_attr >> 16


def _check_zip(infos: list[zipfile.ZipInfo], zf: zipfile.ZipFile, max_unpacked: int) -> None:
    total = 0
    named: list[tuple[str, str | None]] = []
    for info in infos:
        problem = unsafe_name(info.filename)
        kind = stat.S_IFMT(_zip_mode(info))
        target = zf.read(info).decode("utf-8") if kind == stat.S_IFLNK else None
        named.append((info.filename, target))
        if problem is None and target is not None:
            problem = unsafe_link(info.filename.rstrip("/"), target)
        elif problem is None and kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            problem = "a device, fifo or other special file"
        if problem:
            raise UnsafeArchive(
                f"archive member {info.filename!r} is {problem}; nothing was installed",
                hint="the download is not the expected release; check the URL or mirror")
        total += info.file_size
        if total > max_unpacked:
            raise UnsafeArchive(f"archive unpacks to more than {max_unpacked} bytes")
    escaping = link_escape(named)
    if escaping:
        raise _refuse(escaping, "reached outside the target through a chain of links")


# ---- extraction and publishing -------------------------------------------------------------


def extract(archive: Path, dest: Path, kind: str, *, max_unpacked: int) -> None:
    """Extract a tar.gz, tar.xz or zip (a wheel is a zip) into the empty folder dest."""
    import lzma
    import tarfile
    import zipfile
    import zlib

    try:
        _extract(archive, dest, kind, max_unpacked=max_unpacked)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, lzma.LZMAError, zlib.error,
            UnicodeDecodeError) as exc:
        # Only an opted-in unverified download can get here: a verified one is the
        # vendor's. Still one clear error, never a traceback that aborts the sync.
        raise UnsafeArchive(f"{archive.name} is not a valid {kind} archive ({exc}); "
                            "nothing was installed",
                            hint="the download is not the expected release; check the URL "
                                 "or mirror") from None


def _extract(archive: Path, dest: Path, kind: str, *, max_unpacked: int) -> None:
    import tarfile
    import zipfile

    dest.mkdir(parents=True, exist_ok=True)
    if kind in ("tar.gz", "tar.xz"):
        with tarfile.open(archive, "r:gz" if kind == "tar.gz" else "r:xz") as tf:
            members = tf.getmembers()
            _check_tar(members, max_unpacked)
            if hasattr(tarfile, "data_filter"):  # a second guard where Python has one
                tf.extractall(dest, members=members, filter="data")
            else:
                tf.extractall(dest, members=members)
    elif kind in ("zip", "wheel"):
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            _check_zip(infos, zf, max_unpacked)
            for info in infos:
                _extract_zip_member(zf, info, dest)
    else:
        raise ValueError(f"unknown archive kind {kind!r}")


def _extract_zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path) -> None:
    mode = _zip_mode(info)
    out = dest / info.filename
    if info.is_dir():
        out.mkdir(parents=True, exist_ok=True)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    if stat.S_ISLNK(mode) and os.name != "nt":
        os.symlink(zf.read(info).decode("utf-8"), out)
        return
    with zf.open(info) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    # zipfile drops permission bits; executables in wheels and zips need them back.
    if os.name != "nt" and mode & 0o777:
        out.chmod(mode & 0o755 | 0o600)


def single_root(folder: Path) -> Path:
    """The archive's content root: its only top-level folder, if it has exactly one."""
    entries = [p for p in folder.iterdir()]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return folder


def staging_root(checkout: Path) -> Path:
    return checkout / STAGING_DIR


@contextmanager
def staging(checkout: Path, tool: str) -> Iterator[Path]:
    """A fresh folder inside the checkout for one install; always removed afterwards."""
    folder = staging_root(checkout) / f"{tool}-{uuid.uuid4().hex[:12]}"
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish(staged: Path, target: Path) -> None:
    """Put staged where target is: old copy aside, new one in, then old one deleted."""
    recover(target)
    aside = staging_root(target.parent) / f"{target.name}.old-{uuid.uuid4().hex[:12]}"
    had_old = target.exists() or target.is_symlink()
    if had_old:
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(target, aside)
    try:
        os.replace(staged, target)
    except OSError:
        if had_old:
            os.replace(aside, target)
        raise
    fsync_dir(target.parent)
    for old in staging_root(target.parent).glob(f"{target.name}.old-*"):
        _remove(old)


def publish_file(staged: Path, target: Path) -> None:
    """One file into place by rename: the old file stays until the new one is in."""
    os.replace(staged, target)
    fsync_dir(target.parent)


def recover(target: Path) -> None:
    """After a crash between publish's two renames: put the old copy back."""
    if target.exists() or target.is_symlink():
        return
    root = staging_root(target.parent)
    if not root.is_dir():
        return
    for aside in sorted(root.glob(f"{target.name}.old-*")):
        os.replace(aside, target)
        return


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
