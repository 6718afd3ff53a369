"""aitk_common.procs: liveness, a process identity that survives pid reuse, and the
process groups every child of the toolkit is started in (real processes, no fakes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aitk_common import procs

posix = pytest.mark.skipif(os.name == "nt", reason="POSIX process groups")


def sleeper(*extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *extra],
                            **procs.group_options())


def test_liveness_of_this_a_dead_and_an_impossible_pid():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert procs.pid_alive(os.getpid())
    assert not procs.pid_alive(dead.pid) and not procs.pid_alive(0)
    assert not procs.pid_alive(-1) and not procs.pid_alive(2**40)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")
def test_an_exited_child_nobody_reaped_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # it exits; without wait() it stays a zombie
            if Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] \
                    == "Z":
                break
            time.sleep(0.05)
        assert not procs.pid_alive(child.pid)
        assert procs.identify(child.pid) is None
    finally:
        child.wait()


def test_an_identity_names_one_process_and_not_its_pids_next_owner():
    """A recorded pid that now belongs to another process (pid reuse) is not the
    recorded process: its start time differs."""
    child = sleeper("marker-argument")
    try:
        found = procs.identify(child.pid)
        assert found is not None and found.pid == child.pid
        if found.started is not None:  # Linux, macOS, Windows: all tell the start time
            assert procs.still_running(found)
            reused = procs.ProcessIdentity(child.pid, "another start", found.cmdline)
            assert not procs.still_running(reused)
        if found.cmdline is not None:
            assert any("marker-argument" in arg for arg in found.cmdline)
            assert not procs.still_running(procs.ProcessIdentity(child.pid, None, ("x",)))
        assert procs.ProcessIdentity.from_json(found.to_json()) == found
    finally:
        child.kill()
        child.wait()
    assert not procs.still_running(found)
    assert procs.current().pid == os.getpid()


@pytest.mark.parametrize("damaged", [None, [], {"pid": "7"}, {"pid": True}, {"pid": 0},
                                     {"pid": 7, "started": 5}, {"pid": 7, "cmdline": "x"}])
def test_a_damaged_identity_is_none(damaged):
    assert procs.ProcessIdentity.from_json(damaged) is None


@posix
def test_a_group_is_signalled_whole_and_reaped():
    """The child and the worker it started share its group: a stop reaches both."""
    script = ("import subprocess, sys, time\n"
              "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              "print(w.pid, flush=True)\ntime.sleep(120)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             **procs.group_options())
    try:
        worker = int(child.stdout.readline())
        assert os.getpgid(worker) == child.pid != os.getpgid(0)
        assert procs.signal_group(child.pid, signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
        procs.reap_group(child.pid, grace_s=5.0)  # the worker died with the group
        deadline = time.monotonic() + 10
        while procs.pid_alive(worker):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not procs.signal_group(child.pid, signal.SIGTERM)  # gone: says so
    finally:
        procs.kill_group(child.pid)
        child.wait()


def test_windows_groups_get_ctrl_break_whatever_the_stop():
    assert procs.group_options("nt") == {"creationflags": procs.CREATE_NEW_PROCESS_GROUP}
    assert {procs.signal_for_group("nt", s) for s in (2, 15, 21)} == {procs.CTRL_BREAK_EVENT}
    assert procs.group_options("posix") == {"start_new_session": True}
    assert procs.signal_for_group("posix", 15) == 15
