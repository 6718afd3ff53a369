"""One writer at a time (contract stub; the sync engine, issue 3, completes it:
holder pid/command in the message, timeout -> LockTimeout)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from filelock import FileLock, Timeout

from manager.errors import LockTimeout
from manager.paths import Paths


@contextmanager
def hold(paths: Paths, command: str, timeout: float = 600.0) -> Iterator[None]:
    lock = FileLock(str(paths.lock_file))
    try:
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise LockTimeout(f"another manager run holds {paths.lock_file}") from exc
    try:
        yield
    finally:
        lock.release()
