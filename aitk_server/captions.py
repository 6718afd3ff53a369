"""Captioning runs started from the dataset page: each a `python -m aitk caption` child
(aitk.caption does the work) in its own process group, with its status file (the
trainer's format, aitk_common.status: phase `captioning`, step N of total_steps, the
last line as message) and output under `DATA/captioning/<id>/`. One run per dataset at
a time.

Each run is also a record, `DATA/captioning/<id>/run.json` (written atomically: what
ran, the child's process identity, and once it ended, when and how), so a restarted
server lists the runs of earlier starts with their last progress. A run recorded as
running is reconciled on the restart as jobs are (aitk_server/reconcile.py): a child
still alive (same pid and start time) is adopted and can be stopped; one that is gone
ended as its status file says, or, without a final status, as `interrupted` (the
captions written stay, each complete). Ids continue after the highest recorded one, so
a new run never writes into an old run's folder.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitk_common import procs
from aitk_common.files import atomic_write_json
from aitk_common.status import ENV_VAR as STATUS_ENV
from aitk_common.status import Status, StatusFormatError, read_status
from aitk_server import preferences
from aitk_server.preflight import child_env

RECORD = "run.json"
SCHEMA_VERSION = 1
INTERRUPTED = ("the server stopped while this run captioned; the captions written are "
               "kept (caption again to do the rest)")


class CaptionConflict(Exception):
    pass


@dataclass
class Run:
    id: int
    dataset: str
    folder: Path
    model: str
    started: float
    identity: procs.ProcessIdentity | None  # the child, as recorded
    process: subprocess.Popen[bytes] | None = None  # a child of this server start
    ended: float | None = None
    exit_code: int | None = None
    error: str | None = None  # the server's word on how it ended (interrupted)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "id": self.id, "dataset": self.dataset,
                "folder": str(self.folder), "model": self.model, "started": self.started,
                "process": self.identity.to_json() if self.identity else None,
                "ended": self.ended, "exit_code": self.exit_code, "error": self.error}


def parse_record(data: object) -> Run | None:
    """A run from its record; None for one that is damaged or of another version (it
    is not listed; its folder stays)."""
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return None
    run_id, dataset, folder, model = (data.get(k) for k in ("id", "dataset", "folder",
                                                             "model"))
    started, ended, code, error = (data.get(k) for k in ("started", "ended", "exit_code",
                                                          "error"))
    if type(run_id) is not int or not all(isinstance(v, str) for v in (dataset, folder,
                                                                        model)):
        return None
    if not isinstance(started, (int, float)) or not isinstance(ended, (int, float, type(
            None))) or not isinstance(code, (int, type(None))) or not isinstance(
            error, (str, type(None))):
        return None
    return Run(run_id, dataset, Path(folder), model, float(started),
               procs.ProcessIdentity.from_json(data.get("process")), None,
               None if ended is None else float(ended), code, error)


def settled(run: Run, alive: bool, returncode: int | None,
            status: Status | None) -> tuple[int | None, str | None] | None:
    """How a run recorded as running ended: (exit code, error), or None while its
    process lives. `returncode` is known only for this server's own child; an adopted
    one that is gone has its final status, or was interrupted. Pure."""
    if alive:
        return None
    final = status is not None and status.phase.final and (
        run.identity is None or status.pid == run.identity.pid)
    if returncode is not None:
        return returncode, None
    if final:
        assert status is not None
        return status.exit_code, None
    return None, INTERRUPTED


class Captioning:
    def __init__(self, data_dir: Path, root: Path, python: str) -> None:
        self.data_dir, self.root, self.python = data_dir, root, python
        self.lock = threading.Lock()
        self.runs, highest = self.load()
        self.next_id = highest + 1
        for run in self.runs.values():
            self.settle(run)  # the runs a dead server left "running"

    def folder(self, run_id: int) -> Path:
        return self.data_dir / "captioning" / str(run_id)

    def load(self) -> tuple[dict[int, Run], int]:
        """Every recorded run, and the highest id any run folder has (a folder whose
        record is damaged is not listed, but its id is never used again)."""
        runs: dict[int, Run] = {}
        highest = 0
        with suppress(OSError):
            for entry in (self.data_dir / "captioning").iterdir():
                if not (entry.name.isascii() and entry.name.isdigit()):
                    continue
                highest = max(highest, int(entry.name))
                try:
                    run = parse_record(json.loads((entry / RECORD).read_text("utf-8")))
                except (OSError, ValueError, RecursionError):
                    continue
                if run is not None and run.id == int(entry.name):
                    runs[run.id] = run
        return runs, highest

    def save(self, run: Run) -> None:
        atomic_write_json(self.folder(run.id) / RECORD, run.to_json())

    def status(self, run_id: int) -> Status | None:
        try:
            return read_status(self.folder(run_id) / "status.json")
        except (OSError, StatusFormatError):
            return None

    def settle(self, run: Run) -> None:
        """Record the end of a run whose process is gone (once)."""
        if run.ended is not None:
            return
        returncode = run.process.poll() if run.process is not None else None
        if run.process is not None:
            alive = returncode is None
        else:
            alive = run.identity is not None and procs.still_running(run.identity)
        found = settled(run, alive, returncode, self.status(run.id))
        if found is None:
            return
        run.exit_code, run.error = found
        run.ended = time.time()
        self.save(run)

    def running(self, run: Run) -> bool:
        self.settle(run)
        return run.ended is None

    def start(self, dataset: str, folder: Path, model: str, prompt: str | None,
              trigger: str | None, overwrite: bool) -> dict[str, Any]:
        with self.lock:
            if any(r.dataset == dataset and self.running(r) for r in self.runs.values()):
                raise CaptionConflict(f"{dataset} is being captioned already")
            run_id = self.next_id
            where = self.folder(run_id)
            where.mkdir(parents=True, exist_ok=True)
            self.next_id += 1
            argv = [self.python, "-m", "aitk", "caption", str(folder), "--model", model]
            if prompt:
                argv += ["--prompt", prompt]
            if trigger:
                argv += ["--trigger", trigger]
            if overwrite:
                argv.append("--overwrite")
            token = preferences.read_token(self.data_dir)
            extra = {STATUS_ENV: str(where / "status.json")}
            if token:
                extra["HF_TOKEN"] = token
            env = child_env(extra)
            with open(where / "log.txt", "ab") as log:
                child = subprocess.Popen(argv, cwd=self.root, env=env, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, **procs.group_options())
            run = Run(run_id, dataset, folder, model, time.time(),
                      procs.identify(child.pid), child)
            self.runs[run_id] = run
            self.save(run)
            return self.view(run)

    def view(self, run: Run) -> dict[str, Any]:
        running = self.running(run)
        status = self.status(run.id)
        phase = status.phase.value if status is not None else "loading"
        if not running and (status is None or not status.phase.final):
            # died without a word (killed, out of memory), or the server went first
            phase = "interrupted" if run.error == INTERRUPTED else "failed"
        error = run.error or (status.error if status is not None else None)
        if phase == "failed" and not error:  # a stop (130) is no error
            error = self.last_line(run.id) or f"exit code {run.exit_code}"
        return {"id": run.id, "dataset": run.dataset, "model": run.model,
                "running": running, "exit_code": run.exit_code, "phase": phase,
                "error": error, "started": run.started, "ended": run.ended,
                "done": status.step if status is not None else 0,
                "total": status.total_steps if status is not None else None,
                "message": status.message if status is not None else None}

    def last_line(self, run_id: int) -> str:
        try:
            lines = (self.folder(run_id) / "log.txt").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return next((ln for ln in reversed(lines) if ln.strip()), "")[-300:]

    def all(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.view(r) for r in sorted(self.runs.values(), key=lambda r: -r.id)]

    def stop(self, run_id: int) -> dict[str, Any]:
        with self.lock:
            run = self.runs.get(run_id)
            if run is None:
                raise KeyError(run_id)
            if self.running(run):
                # The CLI stops after the current image (its caption kept).
                self._signal(run)
            return self.view(run)

    def _signal(self, run: Run) -> None:
        pid = run.process.pid if run.process is not None else \
            run.identity.pid if run.identity is not None else None
        if pid is not None:
            procs.signal_group(pid, signal.SIGTERM)

    def stop_all(self) -> None:
        with self.lock:
            for run in self.runs.values():
                if self.running(run):
                    self._signal(run)
