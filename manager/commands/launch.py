"""`manager launch [--listen] [--port N] [--no-browser] [--allowed-host NAME] | --example |
CONFIG ...`.

Without configs it serves the web UI (`.venv`'s Python `-m aitk_server`: 127.0.0.1:8675
or the next free port; a second launch says where the running one is). With configs the
trainer runs as `.venv`'s Python `run.py CONFIG...` in this terminal; `--example` runs
the bundled example job. Both run from the checkout, with the local tools on PATH
(manager.tools.child_env) and a cleaned environment. Returns the child's exit code
(128+N if signal N killed it); the install verb calls `run` too.

Before starting, a fast in-sync check: when the venv is out of sync we warn, say how to
fix it and start anyway (a stale optional package should not block a training run; the
desktop launcher runs `update --auto` first, which syncs). Nothing installed yet is an
error (exit 1) with a one-line hint.

Signals: the trainer runs in its own process group, so a terminal's Ctrl+C reaches only
this launcher, which forwards it (SIGINT, SIGTERM, SIGHUP) to the whole group exactly
once; the trainer saves at the next step boundary and exits 130. A second Ctrl+C kills
the group (checkpoints are published by rename, so this loses at most the current step).
The signal is forwarded before anything is printed: on SIGHUP the terminal is gone, and
a write to it fails, which must not cost the trainer its save (issue 14).

On Windows the trainer gets its own process group (CREATE_NEW_PROCESS_GROUP) and every
stop (Ctrl+C, Ctrl+Break, closing the console) is forwarded as CTRL_BREAK_EVENT, the one
console event that can be sent to a group; the trainer treats it like Ctrl+C. That path
cannot be exercised on the Linux test machines. Process groups are aitk_common.procs'
(the web UI's server starts its trainers the same way).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitk_common import procs
from aitk_common.procs import group_options
from manager import errors, process
from manager.paths import Paths, paths

EXAMPLE_CONFIG = Path("config") / "examples" / "train_lora_example_cpu.yaml"
NOT_INSTALLED = ("nothing is installed in this checkout yet: run ./install.sh "
                 "(or python3 -m manager install) first")
# Leftover members of the trainer's group get this long to exit after SIGTERM.
GROUP_GRACE_S = 5.0
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK")  # those this OS has


@dataclass(frozen=True)
class Options:
    configs: tuple[str, ...] = ()  # run.py's arguments: configs (and its flags)
    example: bool = False  # run the bundled example job in the terminal
    ui_args: tuple[str, ...] = ()  # the web UI server's flags
    # `install --json` launches after printing its envelope: stdout must stay JSON only.
    stdout_to_stderr: bool = False


def say(message: str) -> None:
    try:
        print(f"aitk: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # the terminal is gone (SIGHUP): nobody to tell
        pass


def choose(args: tuple[str, ...], *, example: bool = False, listen: bool = False,
           port: int | None = None, no_browser: bool = False,
           allowed_hosts: tuple[str, ...] = ()) -> Options:
    """`launch`'s flags and free arguments -> what to run. The UI's flags do not go with
    a job (it runs in the terminal)."""
    ui = [*(["--listen"] if listen else []), *(["--port", str(port)] if port is not None
                                               else []),
          *(["--no-browser"] if no_browser else []),
          *(arg for name in allowed_hosts for arg in ("--allowed-host", name))]
    if ui and (example or args):
        raise errors.UsageError("--listen, --port, --no-browser and --allowed-host are for "
                                "the web UI (launch without a config); they do not go with "
                                "--example or CONFIG")
    if port is not None and not 0 <= port < 65536:
        raise errors.UsageError(f"launch --port needs a port number (0-65535), got {port}")
    if example:
        return Options(configs=args, example=True)
    return Options(configs=args) if args else Options(ui_args=tuple(ui))


def server_argv(where: Paths, ui_args: tuple[str, ...]) -> list[str]:
    return [str(where.venv_python), "-m", "aitk_server", *ui_args]


def trainer_argv(where: Paths, args: tuple[str, ...], cwd: Path) -> list[str]:
    """The command line. Arguments go to run.py as given, except that a file found from
    the user's folder is made absolute: the trainer runs from the checkout. (Anything
    else, such as a config name run.py looks up in config/, or a flag, passes as is.)"""
    if not args:
        example = where.root / EXAMPLE_CONFIG
        if not example.exists():
            raise errors.ManagerError(f"the bundled example job {EXAMPLE_CONFIG} is missing",
                                      hint="restore it with `git checkout -- config/examples`")
        return [str(where.venv_python), str(where.root / "run.py"), str(example)]
    passed = [str(cwd / a) if not a.startswith("-") and (cwd / a).is_file() else a
              for a in args]
    return [str(where.venv_python), str(where.root / "run.py"), *passed]


def check_installed(where: Paths) -> None:
    if not where.venv_python.exists() or not where.state_file.exists():
        raise errors.ManagerError(NOT_INSTALLED)


def warn_if_out_of_sync(where: Paths, report: Callable[[str], None] = say) -> bool:
    """Fast check (never imports torch); warns and returns False when out of sync."""
    from manager.envstatus import quick_status
    from manager.state import load_state

    try:
        load_state(where)  # corrupt: the sync check below would only guess at the cause
    except errors.StateError as exc:
        report(f"warning: {exc.message}")
        report(f"warning: {exc.hint or 'run `python3 -m manager sync`'}; starting anyway")
        return False
    try:
        status = quick_status(where)
    except Exception as exc:  # noqa: BLE001 - a failed check must not block training
        report(f"warning: could not check the environment is in sync ({exc or type(exc)})")
        return False
    if not status.in_sync:
        for reason in status.reasons or ("reason unknown",):
            report(f"warning: environment out of sync: {reason}")
        report("warning: fix it with `python3 -m manager sync`; starting anyway")
    return status.in_sync


def child_environment(where: Paths) -> dict[str, str]:
    from manager.tools import child_env

    try:
        extra = child_env(where)
    except Exception as exc:  # noqa: BLE001
        say(f"warning: local tools unavailable to the trainer ({exc or type(exc).__name__})")
        extra = {}
    env = process.clean_env(extra)
    env["PYTHONUNBUFFERED"] = "1"  # progress reaches a piped launcher log promptly
    return env


def run(options: Options) -> int:
    where = paths()
    check_installed(where)
    if options.example:
        argv = trainer_argv(where, (), Path.cwd()) + list(options.configs)
    elif options.configs:
        argv = trainer_argv(where, options.configs, Path.cwd())
    else:
        argv = server_argv(where, options.ui_args)
    warn_if_out_of_sync(where)
    return supervise(argv, child_environment(where), where.root,
                     stdout_to_stderr=options.stdout_to_stderr)


def forwarded_signals(signals: Any = signal) -> tuple[int, ...]:
    """The stops the launcher catches and passes on: those of `_FORWARDED` this OS has
    (Windows: SIGINT, SIGTERM, SIGBREAK)."""
    return tuple(getattr(signals, n) for n in _FORWARDED if hasattr(signals, n))


def exit_code(returncode: int) -> int:
    """A child killed by signal N reports -N; shells (and we) say 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(argv: list[str], env: dict[str, str], cwd: Path,
              stdout_to_stderr: bool = False) -> int:
    """Run argv in its own process group, forward stop signals to it, return its code."""
    stdout = sys.stderr.fileno() if stdout_to_stderr else None
    try:
        child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                 stdout=stdout, **group_options())
    except OSError as exc:
        raise errors.ManagerError(f"cannot start the trainer: {exc}",
                                  hint="python3 -m manager doctor") from exc
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) == 1:
            procs.signal_group(child.pid, signum)  # first: saying so may fail (no terminal)
            say("stopping: the trainer saves and exits (press Ctrl+C again to kill it now)")
        else:
            procs.kill_group(child.pid)
            say("killing the trainer")

    previous = {sig: signal.signal(sig, forward) for sig in forwarded_signals()}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        procs.reap_group(child.pid, GROUP_GRACE_S)  # data loader workers left behind
    return exit_code(returncode)

