"""Training jobs started by the toolkit that are still running.

The trainer registers each job as a run record, `<checkout>/.aitk-run/<pid>.json`
(aitk_common.records owns the format: its one writer and its one reader), and removes
it when the job ends. A record whose process is gone (a crash, a reboot) is stale and
ignored; the pid in the file name is authoritative, so a damaged record still counts
while its process lives. Whether it lives is aitk_common.procs' (stdlib only: the
bootstrap imports this module too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aitk_common import records
from aitk_common.procs import pid_alive
from manager.errors import UpdateRefused

__all__ = ["RunningJob", "job_refusal", "pid_alive", "read_record", "running_jobs"]

RUN_DIR = records.RUN_DIR


@dataclass(frozen=True)
class RunningJob:
    """A run record and where it lies (the refusal names the file to delete)."""

    run: records.RunRecord
    record: Path

    @property
    def pid(self) -> int:
        return self.run.pid

    @property
    def name(self) -> str | None:
        return self.run.name

    def describe(self) -> str:
        return self.run.describe()


def job_refusal(jobs: list[RunningJob], doing: str,
                override: str | None = None) -> UpdateRefused | None:
    """Exit 7 naming the running jobs, or None. `doing` says what would harm them
    ("updating would swap code under it"); `override` is the flag that goes ahead anyway."""
    if not jobs:
        return None
    names = "; ".join(job.describe() for job in jobs)
    paths = ", ".join(str(job.record) for job in jobs)
    hint = f"wait for it to finish or stop it; if no job is running, delete {paths}"
    if override:
        hint += f"; {override} goes ahead anyway"
    return UpdateRefused(f"a training job is running: {names}; {doing}", hint=hint)


def running_jobs(root: Path) -> list[RunningJob]:
    jobs = (read_record(path) for path in records.run_record_paths(root))
    return [job for job in jobs if job is not None and pid_alive(job.pid)]


def read_record(path: Path) -> RunningJob | None:
    run = records.read_run_record(path)
    return None if run is None else RunningJob(run, path)
