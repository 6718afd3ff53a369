"""The detail log of one sync: everything the installers print, import errors, the
package changes. The terminal gets one line per step and one per problem; the whole
story goes to `logs/<command>-<time>.log` in the checkout, named once on the terminal.

When the log cannot be written (a read-only checkout), the detail goes to stderr as it
always did, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from manager.paths import Paths

KEEP = 10  # newest logs kept per command; older ones are removed when a new one starts


@dataclass
class RunLog:
    stream: TextIO  # where child processes' output and detail lines go
    path: Path | None  # None: no file, the detail went to stderr

    def note(self, text: str) -> None:
        """A detail line: the log only."""
        self.stream.write(text.rstrip("\n") + "\n")
        self.stream.flush()

    def relative(self, root: Path) -> str | None:
        if self.path is None:
            return None
        try:
            return str(self.path.relative_to(root))
        except ValueError:
            return str(self.path)


def logs_dir(paths: Paths) -> Path:
    return paths.root / "logs"


def _prune(folder: Path, command: str, keep: int) -> None:
    old = sorted(folder.glob(f"{command}-*.log"))[:-keep] if keep > 0 else []
    for path in old:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def open_log(paths: Paths, command: str, keep: int = KEEP) -> Iterator[RunLog]:
    folder = logs_dir(paths)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        folder.mkdir(exist_ok=True)
        _prune(folder, command, keep - 1)
        path = folder / f"{command}-{stamp}.log"
        for n in range(2, 100):  # two runs within one second
            if not path.exists():
                break
            path = folder / f"{command}-{stamp}-{n}.log"
        handle = open(path, "x", encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError:
        yield RunLog(sys.stderr, None)
        return
    log = RunLog(handle, path)
    try:
        log.note(f"aitk {command} in {paths.root}, started {time.ctime()} (pid {os.getpid()})")
        yield log
    finally:
        handle.close()
