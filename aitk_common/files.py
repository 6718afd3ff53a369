"""The one atomic writer: temp file in the same folder, fsync, os.replace.

The trainer (checkpoints, caches, LoRA files, configs), the manager (state, generated
files) and the server (uploads, its record, the secret) all write through it, so Ctrl+C
or a crash leaves the old file or the new one, never a torn one.

Files and folders come out with the modes the umask gives (tempfile creates them
0600/0700), unless `mode` asks for another (0o600 for a secret). A full disk is
`DiskFull`, one message naming the folder, the sizes and the safety margin.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class DiskFull(OSError):
    """Not enough space to write; the message says where and how much is needed."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.strerror)


def umask() -> int:
    """The process umask (read by setting and restoring it: there is no getter)."""
    current = os.umask(0o077)
    os.umask(current)
    return current


def file_mode() -> int:
    return 0o666 & ~umask()


def dir_mode() -> int:
    return 0o777 & ~umask()


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def disk_full(folder: Path, needed: int | None = None, margin: bool = False) -> DiskFull:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    parts = [f"needs about {_mib(needed)}" + (f" plus a {margin_text()}" if margin else "")
             ] if needed else []
    parts += [f"{_mib(free)} free"] if free is not None else []
    sizes = ", ".join(parts)
    return DiskFull(f"not enough disk space in {folder}" + (f" ({sizes})" if sizes else ""))


# Room kept free beyond what a write needs: filesystem metadata and the files written
# beside it (a checkpoint's manifest, the status file) must still fit afterwards.
MARGIN_FRACTION = 0.10
MARGIN_BYTES = 16 * 2**20


def margin_text() -> str:
    return f"{MARGIN_FRACTION:.0%} + {_mib(MARGIN_BYTES)} safety margin"


def check_free_space(folder: Path, needed: int) -> None:
    """DiskFull unless `folder`'s filesystem has room for `needed` bytes plus the
    safety margin (MARGIN_FRACTION of it and MARGIN_BYTES)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # cannot tell: the write itself will say
    if free < needed * (1 + MARGIN_FRACTION) + MARGIN_BYTES:
        raise disk_full(folder, needed, margin=True)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's content, read in chunks (hashlib.file_digest is 3.11+)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


# The temp files atomic_write_bytes writes beside their target: ".NAME.XXXXXXXX.tmp"
# (mkstemp's eight random characters). A process killed mid-write leaves one behind.
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")


def temp_target(path: Path) -> str | None:
    """The name of the file that `path`, a temp file of atomic_write_bytes, was being
    written for; None when `path` is not named like one."""
    found = _TEMP_NAME.fullmatch(Path(path).name)
    return found.group("target") if found else None


def atomic_write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace `path` with `data` in one rename. `mode`: the file's permission bits
    (None: what the umask gives, as for any file the user's programs make)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes 0600; outputs follow the umask
            os.fchmod(fd, file_mode() if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(path.parent, len(data)) from None
        raise
    fsync_dir(path.parent)


def atomic_write_with(path: Path, write: Callable[[Path], None],
                      expected_bytes: int | None = None) -> None:
    """`write(tmp)` writes the content at a temp path beside `path` (a writer that
    streams, for files too large to hold as bytes: safetensors' save_file); then fsync
    and one rename, as atomic_write_bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, file_mode())  # mkstemp makes 0600; outputs follow the umask
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(path.parent, expected_bytes) from None
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: Path, obj: Any, mode: int | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode)


def fsync_dir(folder: Path) -> None:
    """Make a rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish_dir(staged: Path, target: Path, old: Path | None = None) -> None:
    """Rename a finished folder into place. An existing target is moved aside first and
    deleted only after the new one is in, so a crash leaves one complete folder."""
    if target.exists():
        old = old or target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(staged, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, target)
    fsync_dir(target.parent)


@contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """Build a folder beside `target`, then publish it with `publish_dir`; on an error
    (or Ctrl+C) the half-built folder is removed and `target` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    tmp.chmod(dir_mode())  # mkdtemp makes 0700; outputs follow the umask
    try:
        yield tmp
        publish_dir(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
