"""Captioning runs started from the dataset page: each a `python -m aitk caption` child
(aitk.caption does the work) in its own process group, with its status file (the
trainer's format, aitk_common.status: phase `captioning`, step N of total_steps, the
last line as message) and output under `DATA/captioning/<id>/`. One run per dataset at
a time. Runs are kept in memory: a server restart forgets the list (the captions
written stay, each complete).
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitk_common import procs
from aitk_common.status import ENV_VAR as STATUS_ENV
from aitk_common.status import StatusFormatError, read_status
from aitk_server import preferences
from aitk_server.preflight import child_env


class CaptionConflict(Exception):
    pass


@dataclass
class Run:
    id: int
    dataset: str
    folder: Path
    process: subprocess.Popen[bytes]


class Captioning:
    def __init__(self, data_dir: Path, root: Path, python: str) -> None:
        self.data_dir, self.root, self.python = data_dir, root, python
        self.runs: dict[int, Run] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def folder(self, run_id: int) -> Path:
        return self.data_dir / "captioning" / str(run_id)

    def start(self, dataset: str, folder: Path, model: str, prompt: str | None,
              trigger: str | None, overwrite: bool) -> dict[str, Any]:
        with self.lock:
            if any(r.dataset == dataset and r.process.poll() is None
                   for r in self.runs.values()):
                raise CaptionConflict(f"{dataset} is being captioned already")
            run_id = next(self.ids)
            where = self.folder(run_id)
            where.mkdir(parents=True, exist_ok=True)
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
            self.runs[run_id] = Run(run_id, dataset, folder, child)
            return self.view(self.runs[run_id])

    def view(self, run: Run) -> dict[str, Any]:
        code = run.process.poll()
        try:
            status = read_status(self.folder(run.id) / "status.json")
        except (OSError, StatusFormatError):
            status = None
        phase = status.phase.value if status is not None else "loading"
        if code is not None and (status is None or not status.phase.final):
            phase = "failed"  # died without a word (killed, out of memory)
        error = status.error if status is not None else None
        if code not in (None, 0) and not error:
            error = self.last_line(run.id) or f"exit code {code}"
        return {"id": run.id, "dataset": run.dataset, "running": code is None,
                "exit_code": code, "phase": phase, "error": error,
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
        return [self.view(r) for r in sorted(self.runs.values(), key=lambda r: -r.id)]

    def stop(self, run_id: int) -> dict[str, Any]:
        run = self.runs.get(run_id)
        if run is None:
            raise KeyError(run_id)
        if run.process.poll() is None:
            # The CLI stops after the current image (its caption kept).
            procs.signal_group(run.process.pid, signal.SIGTERM)
        return self.view(run)

    def stop_all(self) -> None:
        for run in self.runs.values():
            if run.process.poll() is None:
                procs.signal_group(run.process.pid, signal.SIGTERM)
