"""The one subprocess runner: argv lists, a cleaned environment, timeouts.

The child environment keeps index and proxy settings (mirrors must keep working) and
drops what makes installers write elsewhere or import foreign packages.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from aitk_common import procs

if TYPE_CHECKING:  # imported by each runner below: the many modules that import this
    pass  # one for clean_env or a type never start a process at all

# Removed from every child's environment (see design notes: installs broken by these).
HOSTILE_ENV = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PIP_TARGET",
        "PIP_PREFIX",
        "PIP_USER",
        "PIP_REQUIRE_VIRTUALENV",
        "VIRTUAL_ENV",
        "UV_PROJECT_ENVIRONMENT",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "CONDA_SHLVL",
        "CONDA_PYTHON_EXE",
        "__PYVENV_LAUNCHER__",
    }
)


def clean_env(
    extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in HOSTILE_ENV}
    env["PYTHONNOUSERSITE"] = "1"
    env.setdefault("PYTHONIOENCODING", "utf-8")
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    capture: bool = True,
    own_group: bool = False,
    echo: TextIO | None = None,
) -> Completed:
    """Run argv; never raises for a non-zero exit, a timeout or a missing program.

    With capture=False the child writes straight to our terminal (installer progress).
    With own_group=True the child gets its own process group (no controlling terminal on
    POSIX, so nothing can prompt) and a timeout kills the whole group: a helper it spawned
    (git-remote-https, ssh) would otherwise hold our pipes open and outlive the timeout.
    With echo, the child's stdout and stderr are merged, copied line by line to echo as
    they come (installer progress on our stderr, leaving stdout to --json), and the last
    lines are kept in `stdout` for error messages.
    """
    import subprocess

    args = tuple(str(a) for a in argv)
    child_env = dict(env) if env is not None else clean_env(extra_env)
    if env is not None and extra_env:
        child_env.update(extra_env)
    if own_group:
        return _run_group(args, child_env, cwd, timeout, capture)
    if echo is not None:
        return _run_echoed(args, child_env, cwd, echo)
    try:
        proc = subprocess.run(
            args,
            env=child_env,
            cwd=cwd,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            capture_output=capture,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        err = exc.stderr if isinstance(exc.stderr, str) else ""
        return Completed(args, -1, out, err, timed_out=True)
    except OSError as exc:  # not found, not executable
        return Completed(args, 127, "", str(exc))
    return Completed(args, proc.returncode, proc.stdout or "", proc.stderr or "")


def _run_group(args: tuple[str, ...], env: Mapping[str, str], cwd: Path | None,
               timeout: float | None, capture: bool) -> Completed:
    import subprocess

    pipe = subprocess.PIPE if capture else None
    try:
        proc = subprocess.Popen(args, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=pipe, stderr=pipe, text=True, encoding="utf-8",
                                errors="replace", **procs.group_options())
    except OSError as exc:
        return Completed(args, 127, "", str(exc))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs.kill_group(proc.pid)
        out, err = proc.communicate()
        return Completed(args, -1, out or "", err or "", timed_out=True)
    except BaseException:  # Ctrl+C: the group does not get our SIGINT; take it down too
        procs.kill_group(proc.pid)
        proc.wait()
        raise
    return Completed(args, proc.returncode, out or "", err or "")


def _run_echoed(args: tuple[str, ...], env: dict[str, str], cwd: Path | None,
                echo: TextIO, keep: int = 200) -> Completed:
    import subprocess

    tail: deque[str] = deque(maxlen=keep)
    try:
        proc = subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                encoding="utf-8", errors="replace", bufsize=1)
    except OSError as exc:
        return Completed(args, 127, "", str(exc))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            echo.write(line)
            echo.flush()
        returncode = proc.wait()
    except BaseException:  # Ctrl+C: do not leave the child running on its own
        proc.kill()
        proc.wait()
        raise
    return Completed(args, returncode, "".join(tail), "")
