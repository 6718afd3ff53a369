"""Training jobs started by the toolkit that are still running.

The trainer registers each job as `<checkout>/.aitk-run/<pid>.json` with the keys
{"pid", "name", "config", "started"} and removes it when the job ends. A record whose
process is gone (a crash, a reboot) is stale and ignored; the pid in the file name is
authoritative, so a damaged record still counts while its process lives.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from manager.errors import UpdateRefused

RUN_DIR = ".aitk-run"


@dataclass(frozen=True)
class RunningJob:
    pid: int
    name: str | None
    config: str | None
    started: str | None
    record: Path

    def describe(self) -> str:
        what = self.name or self.config or "a training job"
        since = f", started {self.started}" if self.started else ""
        return f"{what} (pid {self.pid}{since})"


def job_refusal(jobs: list[RunningJob], doing: str,
                override: str | None = None) -> UpdateRefused | None:
    """Exit 7 naming the running jobs, or None. `doing` says what would harm them
    ("updating would swap code under it"); `override` is the flag that goes ahead anyway."""
    if not jobs:
        return None
    names = "; ".join(job.describe() for job in jobs)
    records = ", ".join(str(job.record) for job in jobs)
    hint = f"wait for it to finish or stop it; if no job is running, delete {records}"
    if override:
        hint += f"; {override} goes ahead anyway"
    return UpdateRefused(f"a training job is running: {names}; {doing}", hint=hint)


def running_jobs(root: Path) -> list[RunningJob]:
    folder = root / RUN_DIR
    try:
        records = sorted(folder.glob("*.json"))
    except OSError:
        return []
    jobs = []
    for record in records:
        job = read_record(record)
        if job is not None and pid_alive(job.pid):
            jobs.append(job)
    return jobs


def read_record(record: Path) -> RunningJob | None:
    try:
        pid = int(record.stem)
    except ValueError:
        return None  # not a job record
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # deep nesting too
        data = {}
    if not isinstance(data, dict):
        data = {}

    def text(key: str) -> str | None:
        value = data.get(key)
        return None if value is None else str(value)

    return RunningJob(pid, text("name"), text("config"), text("started"), record)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if os.name == "nt":
        return _pid_alive_windows(pid)
    try:
        os.kill(pid, 0)  # signal 0: existence check, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """An exited process nobody has reaped yet still answers signal 0 (Linux only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _pid_alive_windows(pid: int) -> bool:
    # os.kill on Windows terminates; ask the kernel instead.
    import ctypes

    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    query_limited_information, still_active = 0x1000, 259
    handle = kernel32.OpenProcess(query_limited_information, False, pid)
    if not handle:
        return False
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return False
        return code.value == still_active
    finally:
        kernel32.CloseHandle(handle)
