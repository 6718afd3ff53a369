"""Training progress for people (rich bar, or plain lines when not a tty) and for
plots (a JSON-lines loss log: step, loss, lr, time). A `loss_log.jsonl` that is not such
a log (someone else's file, or a link) is neither trimmed nor appended to."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from aitk.run.status import StatusFile
from aitk.run.trackers import NONE as NO_TRACKERS
from aitk.run.trackers import Trackers
from aitk_common.files import atomic_write_text


def is_loss_log(path: Path) -> bool:
    """Absent, or a regular file whose every line is one of our entries (a JSON object
    with an integer `step` and a `loss`, or a `val_loss`: aitk.run.validation); only a
    last line without its newline (torn by a hard kill) may be anything."""
    if not os.path.lexists(path):
        return True
    if path.is_symlink() or not path.is_file():
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return False
    lines = text.split("\n")
    for line in lines[:-1]:  # the last piece is "" or a torn line
        try:
            entry = json.loads(line)
        except ValueError:
            return False
        if not (isinstance(entry, dict) and type(entry.get("step")) is int
                and ("loss" in entry or "val_loss" in entry)):
            return False
    return True


def trim_log(path: Path, upto_step: int) -> None:
    """On resume, drop entries past the checkpoint so each step appears once."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= upto_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a hard kill
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))


class Metrics:
    def __init__(self, log_path: Path | None, total_steps: int, start_step: int, name: str,
                 stream: TextIO | None = None, status: StatusFile | None = None,
                 trackers: Trackers = NO_TRACKERS) -> None:
        """`log_path` None: console only (the non-writing ranks of a distributed run).
        `trackers` (aitk.run.trackers) get every entry the loss log gets."""
        self.stream = stream or sys.stderr
        self.status = status
        self.trackers = trackers
        self.total = total_steps
        self.start_step = start_step
        self._log: TextIO | None = None
        if log_path is not None and not is_loss_log(log_path):
            print(f"{log_path} was not written by aitk; left as it is (this run's losses "
                  "are not logged to a file)", file=self.stream, flush=True)
            log_path = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            trim_log(log_path, start_step)
            self._log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - close()
        # Speed over the last steps only: a preview or a save must not skew the ETA for long.
        self._times: deque[float] = deque([time.perf_counter()], maxlen=21)
        self._last_print = 0.0
        self.console = Console(file=self.stream)
        self.interactive = self.console.is_terminal
        self._progress: Progress | None = None
        if self.interactive:
            self._progress = Progress(
                TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]}"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
            self._task = self._progress.add_task("train", total=total_steps,
                                                 completed=start_step, loss="-", speed="")
            self._progress.start()

    def message(self, text: str) -> None:
        # soft_wrap: one line per message, whatever the width (rich folds a non-tty at 80)
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def record(self, entry: dict[str, Any]) -> None:
        """Another kind of loss-log entry (a validation loss: aitk.run.validation)."""
        if self._log is not None:
            self._log.write(json.dumps(entry) + "\n")
            self._log.flush()
        self.trackers.scalars(int(entry["step"]), {
            k: float(v) for k, v in entry.items()
            if k not in ("step", "time") and isinstance(v, int | float)})

    def log(self, step: int, loss: float, lr: float) -> None:
        now = time.perf_counter()
        if self._log is not None:
            self._log.write(json.dumps({"step": step, "loss": loss, "lr": lr,
                                        "time": round(time.time(), 6)}) + "\n")
            self._log.flush()
        self.trackers.scalars(step, {"loss": loss, "lr": lr})
        self._times.append(now)
        rate = (len(self._times) - 1) / max(now - self._times[0], 1e-9)
        if self.status is not None:
            self.status.progress(step, loss, rate, (self.total - step) / rate if rate else 0.0)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, loss=f"{loss:.4f}",
                                  speed=f"{rate:.2f} it/s")
        elif now - self._last_print >= 2.0 or step in (self.start_step + 1, self.total):
            self._last_print = now
            eta = (self.total - step) / rate if rate > 0 else 0.0
            print(f"step {step}/{self.total} loss {loss:.4f} lr {lr:.3g} "
                  f"{rate:.2f} it/s eta {eta:.0f}s", file=self.stream, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._log is not None and not self._log.closed:
            self._log.close()
        self.trackers.close()
