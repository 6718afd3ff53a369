"""When the trainer writes its status file (the format: aitk_common.status).

Step updates are written at most every WRITE_INTERVAL_S (a tiny model trains dozens of
steps a second); a phase change or the final state is written at once. A status file
that cannot be written is a warning, never a reason to stop training. Under torchrun
rank 0 alone writes it (aitk.run.job gives the others no path).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from aitk_common.status import Phase, Status, final_phase, parse_problems, write_status

WRITE_INTERVAL_S = 0.5


class StatusFile:
    """Collects the status and publishes it; every method is safe to call often."""

    def __init__(self, path: Path | None, name: str = "") -> None:
        self.path = path
        self.status = Status(pid=os.getpid(), name=name)
        self._last_write = 0.0
        self._warned = False
        # Why the job failed, kept until `finish` publishes it with the exit code.
        self.error: str | None = None
        self.problems: list[str] = []

    def phase(self, phase: Phase | str, *, step: int | None = None,
              total_steps: int | None = None, message: str | None = None) -> None:
        """A new phase; `message` says what a `working` job is at (cleared otherwise)."""
        self.status.phase = Phase(phase)
        self.status.message = message
        if step is not None:
            self.status.step = step
        if total_steps is not None:
            self.status.total_steps = total_steps
        self._write()

    def progress(self, step: int, loss: float, it_per_s: float, eta_s: float) -> None:
        s = self.status
        s.step, s.loss, s.it_per_s, s.eta_s = step, loss, round(it_per_s, 4), round(eta_s, 1)
        if time.monotonic() - self._last_write >= WRITE_INTERVAL_S or \
                step == s.total_steps:
            self._write()

    def validated(self, loss: float, best_step: int, best_loss: float) -> None:
        s = self.status
        s.val_loss, s.best_val_step, s.best_val_loss = loss, best_step, best_loss
        self._write()

    def failed(self, error: str, problems: list[str] | None = None) -> None:
        """Remember why the job failed (and a bad config's problems) for `finish`."""
        self.error, self.problems = error, list(problems or [])

    def finish(self, exit_code: int, error: str | None = None,
               problems: list[str] | None = None) -> None:
        """The final state; `error` and `problems` default to what `failed` noted."""
        s = self.status
        s.phase, s.exit_code = final_phase(exit_code), exit_code
        s.error = error if error is not None else self.error
        s.errors = parse_problems(problems if problems is not None else self.problems)
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self.status.updated = time.time()
        self._last_write = time.monotonic()
        try:
            write_status(self.path, self.status)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(f"warning: cannot write the status file {self.path}: {exc}",
                      file=sys.stderr)
