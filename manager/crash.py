"""Unexpected errors at the CLI boundary: the whole traceback goes to a log file, the
terminal gets one line naming it (issue 14).

The log lives in `<checkout>/logs/`; when that cannot be written (a read-only checkout,
a file where the folder belongs), in the system's temporary folder instead.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
import traceback
from pathlib import Path

from manager.errors import ManagerError
from manager.paths import paths

_NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}
READ_ONLY_HINT = ("the checkout and its .venv must be writable for this command: check "
                  "the permissions and the mount (a read-only file system cannot be synced)")


def describe(exc: BaseException) -> str:
    """One line for the terminal. An OSError names what and where, as the OS says it."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename is not None else ""
        return f"{exc.strerror}{where}"
    if isinstance(exc, RecursionError):
        return "RecursionError: input nested too deeply to process"
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_log(exc: BaseException, argv: list[str]) -> Path | None:
    """Write the traceback; return where, or None when no folder would take it."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    text = (f"aitk manager, {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n"
            f"argv: {argv}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    for folder, prefix in ((paths().root / "logs", "manager-error"),
                           (Path(tempfile.gettempdir()), "aitk-manager-error")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        for n in range(100):  # two failures in one second in one process get two logs
            path = folder / f"{prefix}-{stamp}{f'-{n}' if n else ''}.log"
            try:
                with open(path, "x", encoding="utf-8") as fh:
                    fh.write(text)
                return path
            except FileExistsError:
                continue
            except OSError:
                break
    return None


def as_error(exc: BaseException, argv: list[str]) -> ManagerError:
    """The ManagerError (exit 1) that stands for an unexpected exception."""
    log = write_log(exc, argv)
    where = f"details in {log}" if log else "the traceback could not be saved"
    if isinstance(exc, OSError) and exc.errno in _NOT_WRITABLE:
        return ManagerError(f"{describe(exc)} ({where})", hint=READ_ONLY_HINT)
    return ManagerError(f"unexpected error: {describe(exc)} ({where})",
                        hint="run `python3 -m manager doctor`; if this persists, report it "
                             "with the log file")

