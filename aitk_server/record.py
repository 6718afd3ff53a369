"""`<data_dir>/server.json`: the server that serves a data folder, so a second start
says where it is (and hands out a new sign-in link), and `manager doctor` reports it.

    {"process": {"pid", "started", "cmdline"}, "pid", "url", "host", "port", "started"}

The process is named by its identity (aitk_common.procs: pid and start time), so a
record left by a killed server whose pid was later reused is stale, not "running".
Stdlib only: the manager reads it too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from aitk_common import procs
from aitk_common.files import atomic_write_json

RECORD = "server.json"


def write(data_dir: Path, url: str, host: str, port: int) -> None:
    me = procs.current()
    atomic_write_json(data_dir / RECORD, {"process": me.to_json(), "pid": me.pid,
                                          "url": url, "host": host, "port": port,
                                          "started": time.time()})


def read(data_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((data_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return info if isinstance(info, dict) else None


def alive(info: dict[str, Any]) -> bool:
    """The recorded server still runs. A record from before identities were kept (a pid
    only) counts while that pid runs the server, as far as the OS says."""
    identity = procs.ProcessIdentity.from_json(info.get("process"))
    if identity is not None:
        return procs.still_running(identity)
    pid = info.get("pid")
    now = procs.identify(pid) if isinstance(pid, int) and not isinstance(pid, bool) else None
    return now is not None and (now.cmdline is None or
                                any("aitk_server" in arg for arg in now.cmdline))


def running(data_dir: Path) -> dict[str, Any] | None:
    """The other server serving this data folder, if it still runs."""
    info = read(data_dir)
    if info is None or info.get("pid") == os.getpid() or not alive(info):
        return None
    return info


def remove_if_ours(data_dir: Path) -> None:
    info = read(data_dir)
    if info is not None and info.get("pid") == os.getpid():
        try:
            (data_dir / RECORD).unlink()
        except OSError:
            pass
