"""Jobs as `run.py` child processes: start, stop, reconcile with the real process state,
and run queued jobs one after another.

Each job gets a folder `<data_dir>/jobs/<id>/` with `config.yaml` (what runs),
`status.json` (the trainer's status file, via AITK_STATUS_FILE) and `log.txt` (the
trainer's stdout and stderr). The trainer runs in its own process group (its own
session), so stopping a job signals only it, and a server that dies leaves it running;
a restarted server finds it again through the pid in the database and the status file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aitk_server.db import Database, JobRow
from aitk_server.reconcile import ACTIVE, ended

ONE_AT_A_TIME = 1  # a single accelerator: queued jobs run one after another


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill would terminate it; a handle query is enough there
        import ctypes

        handle = ctypes.windll.kernel32.OpenProcess(0x1000, False, pid)  # type: ignore
        return bool(handle)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited child nobody reaped still answers signal 0
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[:1] != ["Z"]
    except OSError:
        return True


def is_our_trainer(pid: int, config: Path) -> bool:
    """Guards against a reused pid after a restart: the process must be running this
    job's config (checked where /proc exists)."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists():
        return pid_alive(pid)
    try:
        return str(config).encode() in cmdline.read_bytes()
    except OSError:
        return False


def read_status(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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

    def status(self, job_id: int) -> dict[str, Any] | None:
        return read_status(self.status_path(job_id))

    # ---- actions ------------------------------------------------------------------
    def start(self, job: JobRow) -> JobRow:
        """Run now, or queue behind the running job."""
        with self.lock:
            self.reconcile()
            if job.state in ACTIVE:
                return job
            if any(j.state in ACTIVE for j in self.db.all()):
                return self.enqueue(job)
            self._spawn(job)
            return self.db.get(job.id) or job

    def enqueue(self, job: JobRow) -> JobRow:
        with self.lock:
            if job.state not in ACTIVE and job.state != "queued":
                self.db.update(job.id, "queued", state="queued", queue_order=time.time())
            self.pump()
            return self.db.get(job.id) or job

    def _spawn(self, job: JobRow) -> None:
        folder = self.job_dir(job.id)
        folder.mkdir(parents=True, exist_ok=True)
        config = self.config_path(job.id)
        config.write_text(job.config_yaml, encoding="utf-8")
        self.status_path(job.id).unlink(missing_ok=True)  # the last run's final state
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(AITK_STATUS_FILE=str(self.status_path(job.id)), PYTHONUNBUFFERED="1")
        group: dict[str, Any] = (
            {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined]
            if os.name == "nt" else {"start_new_session": True})
        with open(self.log_path(job.id), "ab") as log:
            log.write(f"\n==== start {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
            log.flush()
            try:
                child = subprocess.Popen([self.python, str(self.trainer), str(config)],
                                         cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, **group)
            except OSError as exc:
                self.db.update(job.id, f"could not start: {exc}", state="failed",
                               error=f"cannot start the trainer: {exc}")
                return
        self.children[job.id] = child
        self.db.update(job.id, f"started (pid {child.pid})", state="running", pid=child.pid,
                       exit_code=None, error=None, started=time.time(), ended=None,
                       queue_order=None)

    def stop(self, job: JobRow) -> JobRow:
        """Ask the trainer to save and exit (SIGTERM = its Ctrl+C); a queued job just
        leaves the queue."""
        with self.lock:
            self.reconcile()
            job = self.db.get(job.id) or job
            if job.state == "queued":
                self.db.update(job.id, "removed from the queue", state="stopped",
                               queue_order=None)
            elif job.state == "running" and job.pid:
                self._signal(job.pid)
                self.db.update(job.id, "stop requested", state="stopping")
            return self.db.get(job.id) or job

    def _signal(self, pid: int) -> None:
        try:
            if os.name == "nt":
                os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
            else:
                os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError, OSError):
            pass  # already gone: reconcile records how it ended

    def stop_all(self, timeout: float) -> list[str]:
        """Server shutdown: every running job saves and stops; returns their names."""
        with self.lock:
            self.reconcile()
            active = [j for j in self.db.all() if j.state in ACTIVE]
            for job in active:
                self.stop(job)
            for j in self.db.all():
                if j.state == "queued":
                    self.db.update(j.id, "server stopped", state="stopped", queue_order=None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                j.pid and pid_alive(j.pid) for j in active):
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
            if job.pid and pid_alive(job.pid) and is_our_trainer(job.pid,
                                                                 self.config_path(job.id)):
                return  # adopted after a restart: still running
            returncode = None
        done = ended(job.pid or 0, returncode, self.status(job.id))
        self.db.update(job.id, f"{done.state}" + (f" (exit {done.exit_code})"
                                                  if done.exit_code is not None else ""),
                       state=done.state, exit_code=done.exit_code, error=done.error,
                       ended=time.time())

    def pump(self) -> None:
        with self.lock:
            jobs = self.db.all()
            if sum(j.state in ACTIVE for j in jobs) >= ONE_AT_A_TIME:
                return
            queued = sorted((j for j in jobs if j.state == "queued"),
                            key=lambda j: j.queue_order or 0)
            if queued:
                self._spawn(queued[0])
