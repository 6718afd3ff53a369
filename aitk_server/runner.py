"""Jobs as `run.py` child processes: start, stop, reconcile with the real process state,
and run queued jobs one after another.

Each job gets a folder `<data_dir>/jobs/<id>/` with `config.yaml` (what runs),
`status.json` (the trainer's status file, via AITK_STATUS_FILE) and `log.txt` (the
trainer's stdout and stderr). The trainer runs in its own process group
(aitk_common.procs), so stopping a job signals only it, and a server that dies leaves it
running; a restarted server finds it again through the process identity (pid and start
time) in the database, so a reused pid is never taken for the trainer.

A start is a compare-and-set on the job's state (Database.transition): of two starts at
the same moment, one launches the trainer and the other gets `Conflict`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from aitk_common import procs, requests
from aitk_common import status as status_file
from aitk_common.files import atomic_write_text
from aitk_common.jobstates import ACTIVE, STARTABLE, JobState
from aitk_common.status import Status, StatusFormatError
from aitk_server import preferences
from aitk_server.db import Database, JobRow
from aitk_server.reconcile import ended

ONE_AT_A_TIME = 1  # a single accelerator: queued jobs run one after another


class Conflict(Exception):
    """The job's state does not allow what was asked (the API answers 409)."""


def read_status(path: Path) -> Status | None:
    """The trainer's status (aitk_common.status owns the format); None when there is
    none yet or it cannot be read (a half-provisioned folder, a foreign file)."""
    try:
        return status_file.read_status(path)
    except (OSError, StatusFormatError):
        return None


def is_our_trainer(job: JobRow, config: Path) -> bool:
    """The job's recorded process still runs: the same pid and start time (a reused pid
    is another process). A row from before identities were kept falls back to the
    command line naming this job's config (where /proc tells)."""
    recorded = procs.ProcessIdentity.from_json(_json(job.process))
    if recorded is not None:
        return procs.still_running(recorded)
    now = procs.identify(job.pid or 0)
    if now is None:
        return False
    return now.cmdline is None or str(config) in now.cmdline


def _json(text: str | None) -> object:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def queue_of(jobs: list[JobRow]) -> list[JobRow]:
    """The queued jobs in the order they will start."""
    return sorted((j for j in jobs if j.state == JobState.QUEUED),
                  key=lambda j: (j.queue_order or 0, j.id))


def reordered(queue: list[tuple[int, float]], first: list[int]) -> dict[int, float]:
    """New places for a queue of (job id, place), in order: the jobs `first` go to the
    front in that order, the rest follow as they were. The places the queue already
    holds are handed out again, so a job queued later still goes last. Only the jobs
    whose place changes; ValueError for a job twice or one not in the queue."""
    ids = [job_id for job_id, _ in queue]
    if len(set(first)) != len(first):
        raise ValueError("a job is named twice")
    missing = [i for i in first if i not in ids]
    if missing:
        raise ValueError(f"not queued: {', '.join(map(str, missing))}")
    wanted = first + [i for i in ids if i not in first]
    places = sorted(place for _, place in queue)
    for n in range(1, len(places)):  # two jobs queued in the same instant: keep it strict
        places[n] = max(places[n], math.nextafter(places[n - 1], math.inf))
    old = dict(queue)
    return {i: p for i, p in zip(wanted, places, strict=True) if old[i] != p}


class Runner:
    def __init__(self, db: Database, data_dir: Path, root: Path,
                 python: str = sys.executable, trainer: Path | None = None) -> None:
        self.db = db
        self.data_dir = data_dir
        self.root = root
        self.python = python
        self.trainer = trainer or root / "run.py"  # tests: a run.py that pauses on cue
        self.children: dict[int, subprocess.Popen[bytes]] = {}  # job id -> our child
        self.lock = threading.RLock()

    # ---- files --------------------------------------------------------------------
    def job_dir(self, job_id: int) -> Path:
        return self.data_dir / "jobs" / str(job_id)

    def config_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / "config.yaml"

    def status_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / "status.json"

    def log_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / "log.txt"

    def requests_dir(self, job_id: int) -> Path:
        """Where "save now" / "sample now" wait for the trainer (aitk_common.requests)."""
        return self.job_dir(job_id) / "requests"

    def status(self, job_id: int) -> Status | None:
        return read_status(self.status_path(job_id))

    def _get(self, job_id: int) -> JobRow:
        found = self.db.get(job_id)
        if found is None:
            raise Conflict("that job no longer exists")
        return found

    # ---- actions ------------------------------------------------------------------
    def start(self, job_id: int) -> JobRow:
        """Run now, or queue behind the running job; Conflict when its state allows no
        start (running, stopping, queued)."""
        with self.lock:
            self.reconcile()
            job = self._get(job_id)
            if job.state not in STARTABLE:
                raise Conflict(f"{job.name} is {job.state}; it cannot be started now")
            if any(j.state in ACTIVE for j in self.db.all()):
                return self.enqueue(job_id)
            self._spawn(job, STARTABLE)
            return self._get(job_id)

    def enqueue(self, job_id: int) -> JobRow:
        """Queue a job that may start; one already queued or running stays as it is."""
        with self.lock:
            self.db.transition(job_id, STARTABLE, "queued", state=JobState.QUEUED,
                               queue_order=time.time())
            self.pump()
            return self._get(job_id)

    def reorder(self, first: list[int]) -> list[JobRow]:
        """The queued jobs `first` go to the front of the queue in that order; the
        queue, in its new order. Conflict naming a job that is not queued (it started
        or left the queue since the page showed it)."""
        with self.lock:
            jobs = self.db.all()
            queue = queue_of(jobs)
            queued = {j.id for j in queue}
            off = [j for i in first for j in jobs if j.id == i and i not in queued]
            if off:
                raise Conflict("; ".join(f"{j.name} is {j.state}, not queued" for j in off))
            changes = reordered([(j.id, j.queue_order or 0.0) for j in queue], first)
            if changes and not self.db.set_queue_order(changes, "moved in the queue"):
                raise Conflict("the queue changed meanwhile; try again")
            return queue_of(self.db.all())

    def _spawn(self, job: JobRow, leaving: frozenset[JobState]) -> None:
        if not self.db.transition(job.id, leaving, "starting", state=JobState.RUNNING,
                                  pid=None, process=None, exit_code=None, error=None,
                                  started=time.time(), ended=None, queue_order=None):
            raise Conflict(f"{job.name} was started by another request")
        try:
            child = self._launch(job)
        except OSError as exc:
            self.db.update(job.id, f"could not start: {exc}", state=JobState.FAILED,
                           error=f"cannot start the trainer: {exc}", ended=time.time())
            return
        self.children[job.id] = child
        identity = procs.identify(child.pid)
        self.db.update(job.id, f"started (pid {child.pid})", pid=child.pid,
                       process=json.dumps(identity.to_json()) if identity else None)

    def _launch(self, job: JobRow) -> subprocess.Popen[bytes]:
        config = self.config_path(job.id)
        atomic_write_text(config, job.config_yaml)
        self.status_path(job.id).unlink(missing_ok=True)  # the last run's final state
        requests.take(self.requests_dir(job.id))  # asked of an earlier run: not this one
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update({"AITK_STATUS_FILE": str(self.status_path(job.id)),
                    requests.ENV_VAR: str(self.requests_dir(job.id)),
                    "PYTHONUNBUFFERED": "1"})
        token = preferences.read_token(self.data_dir)  # the settings page's token
        if token:
            env["HF_TOKEN"] = token
        with open(self.log_path(job.id), "ab") as log:
            log.write(f"\n==== start {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
            log.flush()
            return subprocess.Popen([self.python, str(self.trainer), str(config)],
                                    cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    **procs.group_options())

    def stop(self, job_id: int) -> JobRow:
        """Ask the trainer to save and exit (SIGTERM = its Ctrl+C; CTRL_BREAK on
        Windows); a queued job just leaves the queue. Conflict when there is nothing to
        stop."""
        with self.lock:
            self.reconcile()  # first: a pid whose trainer is gone is never signalled
            job = self._get(job_id)
            if job.state == JobState.QUEUED:
                self.db.transition(job.id, {JobState.QUEUED}, "removed from the queue",
                                   state=JobState.STOPPED, queue_order=None)
            elif job.state == JobState.RUNNING:
                if self.db.transition(job.id, {JobState.RUNNING}, "stop requested",
                                      state=JobState.STOPPING) and job.pid:
                    procs.signal_group(job.pid, signal.SIGTERM)
            else:
                raise Conflict(f"{job.name} is {job.state}; there is nothing to stop")
            return self._get(job_id)

    def stop_all(self, timeout: float) -> list[str]:
        """Server shutdown: every running job saves and stops; returns their names."""
        with self.lock:
            self.reconcile()
            active = [j for j in self.db.all() if j.state in ACTIVE]
            for job in active:
                if job.state == JobState.RUNNING:
                    self.stop(job.id)
            for j in self.db.all():
                if j.state == JobState.QUEUED:
                    self.db.update(j.id, "server stopped", state=JobState.STOPPED,
                                   queue_order=None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                j.pid and procs.pid_alive(j.pid) for j in active):
            time.sleep(0.2)
        self.reconcile()
        return [j.name for j in active]

    # ---- the truth ----------------------------------------------------------------
    def reconcile(self) -> None:
        """Bring every active row in line with its process, then start queued work."""
        with self.lock:
            for job in self.db.all():
                if job.state in ACTIVE:
                    self._reconcile_one(job)
            self.pump()

    def _reconcile_one(self, job: JobRow) -> None:
        child = self.children.get(job.id)
        if child is not None:
            returncode = child.poll()
            if returncode is None:
                return
            del self.children[job.id]
        else:
            if job.pid and is_our_trainer(job, self.config_path(job.id)):
                return  # adopted after a restart: still running
            returncode = None
        done = ended(job.pid or 0, returncode, self.status(job.id),
                     stop_requested=job.state == JobState.STOPPING)
        self.db.update(job.id, f"{done.state}" + (f" (exit {done.exit_code})"
                                                  if done.exit_code is not None else ""),
                       state=done.state, exit_code=done.exit_code, error=done.error,
                       ended=time.time())

    def pump(self) -> None:
        with self.lock:
            jobs = self.db.all()
            if sum(j.state in ACTIVE for j in jobs) >= ONE_AT_A_TIME:
                return
            queued = queue_of(jobs)
            if queued:
                self._spawn(queued[0], frozenset({JobState.QUEUED}))
