"""Stopping a run: every signal that ends a terminal reaches a save.

SIGINT (Ctrl+C), SIGTERM, SIGHUP (the terminal or the launcher that started us was
closed) and SIGBREAK (Ctrl+Break or the launcher's CTRL_BREAK_EVENT on Windows) all mean
"stop, but save": the first one finishes the step, saves a checkpoint and exits 130; a
second stops at once. After SIGHUP the console may be gone, so writes to it never fail
(LenientStream).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from aitk.errors import Interrupted

STOP_SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK")


def stop_signals(signals: Any = signal) -> tuple[int, ...]:
    """The stop-and-save signals this OS has (Windows: SIGINT, SIGTERM, SIGBREAK)."""
    return tuple(getattr(signals, n) for n in STOP_SIGNAL_NAMES if hasattr(signals, n))


STOP_SIGNALS = stop_signals()


class StopFlag:
    """First signal: finish the step, save, exit 130. Second: stop at once.

    Stopping at once is safe because every file is published by an atomic rename:
    an interrupted save leaves only a temp folder, removed at the next start.
    """

    def __init__(self, say: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
                 notice: str = "stopping after this step and saving a checkpoint") -> None:
        self.requested = False
        self.say = say
        self.notice = notice  # what the first signal does (`aitk caption` says its own)

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        try:  # after SIGHUP the terminal may be gone: saving matters more than saying so
            self.say(f"\n{signal.Signals(signum).name}: {self.notice}; press Ctrl+C again "
                     "to stop at once")
        except (OSError, ValueError):
            pass

    def check(self) -> None:
        if self.requested:
            raise Interrupted

    @contextmanager
    def installed(self) -> Iterator[StopFlag]:
        old = {s: signal.signal(s, self.handle) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


class LenientStream:
    """The console for as long as there is one. After SIGHUP the terminal (or the pipe to
    the launcher) may be gone and every write fails (EIO, EPIPE): the output is then
    dropped, so a lost progress line never costs the save that the signal asked for."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):
                self.lost = True
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.lost = True

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno: the real stream's
        return getattr(self._stream, name)
