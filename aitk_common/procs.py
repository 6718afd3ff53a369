"""Processes: is one alive, is it still the one we recorded, and starting and stopping a
child in its own process group, on POSIX and Windows.

A pid alone does not name a process: once it exits, the OS hands the number to the next
one. A record that must survive that (the web UI's server record, a job's trainer) keeps
a `ProcessIdentity`: the pid with the process's start time (and its command line where
the OS tells), and `still_running()` compares all of them.

Where the start time comes from:
    Linux    /proc/PID/stat field 22 (clock ticks since boot) with the boot id, so a
             reboot never matches an old record; the command line from /proc/PID/cmdline
    Windows  GetProcessTimes' creation time (no command line: it needs a privileged read)
    others   `ps -o lstart=` (seconds; macOS, BSD) and `ps -o command=`
When none answers, the identity is the pid alone and says so (`started` is None).

Process groups: a child started with `group_options()` has its own group (POSIX: its own
session; Windows: CREATE_NEW_PROCESS_GROUP), so a terminal's Ctrl+C reaches only its
parent, and a stop reaches the whole group and nothing else. On Windows the one console
event a group can be sent is CTRL_BREAK_EVENT (the child sees SIGBREAK), whatever the
stop was; that path cannot be exercised on the Linux test machines.

Stdlib only: the manager's bootstrap imports it before `.venv` exists.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Windows' values, where the modules lack them (so the decisions below test on Linux).
CTRL_BREAK_EVENT: int = getattr(signal, "CTRL_BREAK_EVENT", 1)
CREATE_NEW_PROCESS_GROUP: int = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200)
_STILL_ACTIVE = 259  # GetExitCodeProcess' answer for a process that has not exited
_QUERY_LIMITED_INFORMATION = 0x1000


# ---- liveness ---------------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    """A process with this pid exists and has not exited (an exited child nobody reaped
    yet is not alive). Sends nothing."""
    if pid <= 0:
        return False
    if os.name == "nt":
        return _windows_alive(pid)
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it is another user's
    except OverflowError:
        return False  # not a pid this OS can have
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[:1] == ["Z"]


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and
    parentheses), from field 3 (the state) on; None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _windows_alive(pid: int) -> bool:
    # os.kill on Windows terminates the process; ask the kernel instead.
    import ctypes

    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return False
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return False
        return code.value == _STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


# ---- identity ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    started: str | None  # an OS-specific start-time token; None when the OS told nothing
    cmdline: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started": self.started,
                "cmdline": list(self.cmdline) if self.cmdline is not None else None}

    @classmethod
    def from_json(cls, data: object) -> ProcessIdentity | None:
        """The identity a record holds; None when it holds none (or a damaged one)."""
        if not isinstance(data, dict):
            return None
        pid, started, cmdline = data.get("pid"), data.get("started"), data.get("cmdline")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        if started is not None and not isinstance(started, str):
            return None
        if cmdline is not None and not (isinstance(cmdline, list) and
                                        all(isinstance(a, str) for a in cmdline)):
            return None
        return cls(pid, started, tuple(cmdline) if cmdline is not None else None)


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of the live process `pid`; None when no such process is alive."""
    if not pid_alive(pid):
        return None
    if os.name == "nt":
        return ProcessIdentity(pid, _windows_started(pid))
    stat = _proc_stat(pid)
    if stat is not None:
        return ProcessIdentity(pid, _linux_started(stat), _linux_cmdline(pid))
    return ProcessIdentity(pid, _ps(pid, "lstart"), _ps_cmdline(pid))


def current() -> ProcessIdentity:
    found = identify(os.getpid())
    assert found is not None  # this process is alive
    return found


def still_running(recorded: ProcessIdentity) -> bool:
    """The recorded process is alive and is the same process: its start time (else its
    command line) matches. A record that holds neither is judged by its pid alone."""
    now = identify(recorded.pid)
    if now is None:
        return False
    if recorded.started is not None and now.started is not None:
        return recorded.started == now.started
    if recorded.cmdline is not None and now.cmdline is not None:
        return recorded.cmdline == now.cmdline
    return True


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _linux_started(stat: list[str]) -> str | None:
    # Field 22 of /proc/PID/stat; `stat` starts at field 3.
    if len(stat) < 20 or not stat[19].isdigit():
        return None
    return f"{_boot_id()}:{stat[19]}"


def _linux_cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(a.decode("utf-8", errors="replace") for a in raw.split(b"\0") if a) or None


def _ps(pid: int, field: str) -> str | None:
    try:
        done = subprocess.run(["ps", "-p", str(pid), "-o", f"{field}="], capture_output=True,
                              text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    value = " ".join(done.stdout.split())
    return value if done.returncode == 0 and value else None


def _ps_cmdline(pid: int) -> tuple[str, ...] | None:
    found = _ps(pid, "command")
    return (found,) if found else None


def _windows_started(pid: int) -> str | None:
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return None
    try:
        times = [wintypes.FILETIME() for _ in range(4)]
        if not kernel32.GetProcessTimes(handle, *(ctypes.byref(t) for t in times)):
            return None
        created = times[0]
        return str((created.dwHighDateTime << 32) | created.dwLowDateTime)
    finally:
        kernel32.CloseHandle(handle)


# ---- process groups ---------------------------------------------------------------------
def group_options(os_name: str = os.name) -> dict[str, Any]:
    """Popen options that give the child its own process group."""
    if os_name == "nt":
        return {"creationflags": CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def signal_for_group(os_name: str, signum: int) -> int:
    """What a child's group is sent for the stop `signum`: on Windows CTRL_BREAK_EVENT
    whatever the stop (the one console event a group can be sent), elsewhere the same."""
    return CTRL_BREAK_EVENT if os_name == "nt" else signum


def signal_group(pid: int, signum: int) -> bool:
    """Send the stop `signum` to the group led by `pid` (a child started with
    `group_options()`); False when the group is already gone."""
    sent = signal_for_group(os.name, signum)
    try:
        if os.name == "nt":
            os.kill(pid, sent)  # a console event for the group whose id is the pid
        else:
            os.killpg(pid, sent)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    except OSError:  # Windows: the process is gone, or has no console
        return False
    return True


def kill_group(pid: int) -> None:
    """End the group now (POSIX: SIGKILL to the group; Windows: the child's whole tree
    with taskkill /T, which has no group signal, then TerminateProcess on the child)."""
    try:
        if os.name == "nt":
            import subprocess

            subprocess.run(["taskkill", "/F", "/T", "/PID", str(pid)], timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            os.kill(pid, signal.SIGTERM)  # TerminateProcess, if taskkill could not
        else:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError, ValueError):
        pass  # already gone (or taskkill missing/slow: TerminateProcess was the fallback)


def reap_group(pgid: int, grace_s: float) -> None:
    """POSIX: stop what a child left behind in its group (data loader workers): SIGTERM,
    `grace_s` to exit, then SIGKILL. Windows has no group to reap."""
    if os.name == "nt":
        return
    for signum, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)

