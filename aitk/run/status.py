"""The job's status file: what a watcher (the web UI's server) reads instead of parsing
the console. One small JSON object, replaced atomically, so a reader never sees half a
file:

    {"schema_version": 1, "pid", "name", "phase", "step", "total_steps", "loss",
     "it_per_s", "eta_s", "message", "exit_code", "error", "errors", "started", "updated"}

`phase` is one of PHASES; the last three are final (`exit_code` set). `errors` holds a
bad config's problems as data: [{"path": "config.process[0].train.steps", "message"}].

Where: `$AITK_STATUS_FILE` when set (the server gives each job its own), else
`training_folder/NAME/status.json`. Step updates are written at most every
WRITE_INTERVAL_S (a tiny model trains dozens of steps a second); a phase change or the
final state is written at once. A status file that cannot be written is a warning, never
a reason to stop training.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from aitk_common.files import atomic_write_json

SCHEMA_VERSION = 1
ENV_VAR = "AITK_STATUS_FILE"
FILE_NAME = "status.json"
PHASES = ("loading", "caching", "training", "sampling", "saving",
          "finished", "stopped", "failed")
FINAL_PHASES = frozenset({"finished", "stopped", "failed"})
WRITE_INTERVAL_S = 0.5


def problem_fields(problems: list[str]) -> list[dict[str, str]]:
    """Config problems ("path: message" lines) as data; a line without a path keeps an
    empty one (it is about the whole file)."""
    out = []
    for line in problems:
        path, sep, message = line.partition(": ")
        if not sep or " " in path:
            path, message = "", line
        out.append({"path": path, "message": message})
    return out


def final_phase(exit_code: int) -> str:
    return {0: "finished", 130: "stopped"}.get(exit_code, "failed")


def status_path(out_dir: Path | None) -> Path | None:
    chosen = os.environ.get(ENV_VAR)
    if chosen:
        return Path(chosen)
    return out_dir / FILE_NAME if out_dir is not None else None


class StatusFile:
    """Collects the fields and publishes them; every method is safe to call often."""

    def __init__(self, path: Path | None, name: str = "") -> None:
        self.path = path
        self._last_write = 0.0
        self._warned = False
        now = time.time()
        self.fields: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "pid": os.getpid(), "name": name,
            "phase": "loading", "step": 0, "total_steps": None, "loss": None,
            "it_per_s": None, "eta_s": None, "message": None, "exit_code": None,
            "error": None, "errors": [], "started": now, "updated": now}

    def move_to(self, path: Path | None) -> None:
        """Once the output folder is known (the env var, when set, always wins)."""
        if self.path is None and path is not None:
            self.path = path
            self._write()

    def phase(self, phase: str, **fields: Any) -> None:
        self.fields.update(fields, phase=phase)
        self._write()

    def progress(self, step: int, loss: float, it_per_s: float, eta_s: float) -> None:
        self.fields.update(step=step, loss=loss, it_per_s=round(it_per_s, 4),
                           eta_s=round(eta_s, 1))
        if time.monotonic() - self._last_write >= WRITE_INTERVAL_S or \
                step == self.fields.get("total_steps"):
            self._write()

    def finish(self, exit_code: int, error: str | None = None,
               problems: list[str] | None = None) -> None:
        self.fields.update(phase=final_phase(exit_code), exit_code=exit_code, error=error,
                           errors=problem_fields(problems or []))
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self.fields["updated"] = time.time()
        self._last_write = time.monotonic()
        try:
            atomic_write_json(self.path, self.fields)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(f"warning: cannot write the status file {self.path}: {exc}",
                      file=sys.stderr)
