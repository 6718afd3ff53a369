"""Model identity: a content fingerprint of the weight files, part of every cache key.

Hashing a 20 GB model takes a while, so file digests are remembered per
(absolute path, inode, size, mtime) in this process and, when the caller passes a
`digest_cache` file, across runs as well. That file is only a cache: an unreadable one
is ignored and rewritten (atomically), never trusted blindly, and an edited weight file
changes its size or mtime and so is hashed again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from aitk_common.files import sha256_file

_MEMORY: dict[str, str] = {}
DIGEST_CACHE_VERSION = 1


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"


def file_sha256(path: Path, store: dict[str, str] | None = None) -> str:
    """sha256 of one file's content, reusing a digest whose stat key still matches."""
    key = _stat_key(path)
    digest = _MEMORY.get(key) or (store or {}).get(key)
    if digest is None:
        digest = sha256_file(path)
    _MEMORY[key] = digest
    if store is not None:
        store[key] = digest
    return digest


def _read_store(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != DIGEST_CACHE_VERSION:
        return {}
    digests = data.get("digests")
    return {k: v for k, v in digests.items() if isinstance(v, str)} if isinstance(
        digests, dict) else {}


def weights_identity(arch: str, name_or_path: str, extra: Iterable[str] = (),
                     digest_cache: Path | None = None) -> str:
    """sha256 over the arch, `extra` lines and every file under `name_or_path`.

    A name that is not a local path (a hub id) is hashed by name.
    """
    h = hashlib.sha256()
    h.update(f"arch={arch}\n".encode())
    for line in extra:
        h.update(f"{line}\n".encode())
    store = _read_store(Path(digest_cache)) if digest_cache is not None else None
    before = dict(store) if store is not None else None
    root = Path(name_or_path).expanduser()
    if root.is_file():
        h.update(f"{root.name}={file_sha256(root, store)}\n".encode())
    elif root.is_dir():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            h.update(f"{rel}={file_sha256(path, store)}\n".encode())
    else:
        h.update(f"name={name_or_path}\n".encode())
    if store is not None and store != before:
        from aitk_common.files import atomic_write_json

        atomic_write_json(Path(digest_cache),
                          {"version": DIGEST_CACHE_VERSION, "digests": store})
    return h.hexdigest()
