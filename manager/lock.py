"""One writer at a time: a file lock held for a whole install/sync/test.

The OS releases the lock when its holder dies (even by kill -9), so a stale lock cannot
block anyone. Who holds it (pid, command, since when) is kept in a small file beside it,
so a second run can say whom it waits for. Read-only commands never take the lock.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from aitk_common.files import atomic_write_json
from manager import envvars
from manager.errors import LockTimeout
from manager.paths import Paths

DEFAULT_TIMEOUT = 600.0
TIMEOUT_ENV = "AITK_LOCK_TIMEOUT"


def holder_file(paths: Paths) -> Path:
    return paths.lock_file.with_name(paths.lock_file.name + ".holder")


def read_holder(paths: Paths) -> dict[str, object] | None:
    try:
        data = json.loads(holder_file(paths).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def describe_holder(holder: dict[str, object] | None) -> str:
    if not holder:
        return "another manager run"
    since = holder.get("since")
    age = f", for {time.time() - since:.0f}s" if isinstance(since, (int, float)) else ""
    return f"pid {holder.get('pid')} (`{holder.get('command')}`{age})"


def timeout_from_env(default: float = DEFAULT_TIMEOUT) -> float:
    return envvars.seconds(TIMEOUT_ENV, default)


def _stderr(message: str) -> None:
    print(f"aitk: {message}", file=sys.stderr, flush=True)


@contextmanager
def hold(paths: Paths, command: str, timeout: float | None = None,
         say: Callable[[str], None] = _stderr) -> Iterator[None]:
    """Hold the lock; wait (saying for whom) up to `timeout` seconds, then LockTimeout."""
    limit = timeout_from_env() if timeout is None else timeout
    paths.lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(paths.lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = read_holder(paths)
        say(f"waiting for {describe_holder(holder)} to finish "
            f"(lock {paths.lock_file}; giving up after {limit:.0f}s)")
        try:
            lock.acquire(timeout=limit)
        except Timeout as exc:
            raise LockTimeout(
                f"gave up after {limit:.0f}s: {describe_holder(read_holder(paths))} "
                f"still holds {paths.lock_file}",
                hint=f"let it finish or stop it, then run the command again "
                     f"({TIMEOUT_ENV} sets how long to wait)") from exc
    try:
        atomic_write_json(holder_file(paths),
                          {"pid": os.getpid(), "command": command, "since": time.time()})
        yield
    finally:
        with suppress(OSError):
            holder_file(paths).unlink()
        lock.release()
