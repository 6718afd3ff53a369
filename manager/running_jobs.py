"""Training jobs started by the toolkit that are still running.

The trainer registers each job as `<checkout>/.aitk-run/<pid>.json` with the keys
{"pid", "name", "config", "started"} and removes it when the job ends. A record whose
process is gone (a crash, a reboot) is stale and ignored; the pid in the file name is
authoritative, so a damaged record still counts while its process lives. Whether it
lives is aitk_common.procs' (stdlib only: the bootstrap imports this module too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aitk_common.procs import pid_alive
from manager.errors import UpdateRefused

__all__ = ["RunningJob", "job_refusal", "pid_alive", "read_record", "running_jobs"]

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

