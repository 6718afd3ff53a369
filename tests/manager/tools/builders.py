"""Archives with stand-in binaries, and tree snapshots, for the tools tests."""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

# ---- archives with stand-in binaries -------------------------------------------------------


def script(version_line: str) -> bytes:
    return f"#!/bin/sh\necho '{version_line}'\n".encode()


@dataclass(frozen=True)
class Entry:
    name: str
    data: bytes = b""
    kind: str = "file"  # "file" | "dir" | "symlink" | "hardlink" | "device" | "fifo"
    target: str = ""  # links
    mode: int = 0o644


def exe(name: str, version_line: str) -> Entry:
    return Entry(name, script(version_line), mode=0o755)


def make_tar(entries: list[Entry], compression: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}") as tf:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mode = e.mode
            if e.kind == "file":
                info.size = len(e.data)
                tf.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "device": tarfile.CHRTYPE,
                         "fifo": tarfile.FIFOTYPE}[e.kind]
            info.linkname = e.target
            tf.addfile(info)
    return buf.getvalue()


def make_zip(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for e in entries:
            info = zipfile.ZipInfo(e.name + ("/" if e.kind == "dir" else ""))
            kind = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK,
                    "device": stat.S_IFCHR}[e.kind]
            info.external_attr = (kind | e.mode) << 16
            zf.writestr(info, e.target.encode() if e.kind == "symlink" else e.data)
    return buf.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """A snapshot of a folder: relative path -> kind and content digest."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + str(p.readlink())
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = sha(p.read_bytes())
    return out


def outside_staging(root: Path) -> dict[str, str]:
    return {k: v for k, v in tree(root).items() if not k.startswith(".aitk-staging")}
