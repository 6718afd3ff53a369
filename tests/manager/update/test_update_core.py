"""The pure parts: flag forwarding, decisions, git's environment and porcelain, job records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from manager import errors, repo
from manager.cli import main
from manager.commands import update
from manager.commands.update import Options
from manager.repo import RepoStatus
from manager.running_jobs import pid_alive, read_record, running_jobs

# --- every flag reaches the re-executed sync ------------------------------------------


def test_every_option_has_a_flag_and_round_trips() -> None:
    for f in fields(Options):
        one = replace(Options(), **{f.name: True})
        assert one.to_argv() == [f.metadata["flag"]]
    everything = Options(**{f.name: True for f in fields(Options)})
    assert everything.to_argv() == ["--auto", "--force", "--dry-run", "--cpu"]


def test_sync_argv_forwards_the_shared_flags() -> None:
    assert Options().sync_argv() == ["sync"]
    assert Options(cpu=True, dry_run=True, auto=True, force=True).sync_argv() == [
        "sync", "--dry-run", "--cpu"]
    command = update.sync_command(Options(cpu=True))
    assert command[1:] == ["-m", "manager", "sync", "--cpu"]


def test_every_update_flag_is_accepted_by_the_cli(monkeypatch) -> None:
    """The cli builds Options from exactly the flags to_argv() emits."""
    seen: list[Options] = []

    def fake_run(options: Options):
        seen.append(options)
        from manager.output import Result
        return Result()

    monkeypatch.setattr(update, "run", fake_run)
    everything = Options(**{f.name: True for f in fields(Options)})
    assert main(["update", *everything.to_argv()]) == 0
    assert seen == [everything]


# --- decisions ------------------------------------------------------------------------

BASE = RepoStatus(branch="main", commit="a" * 40, upstream="origin/main",
                  upstream_commit="b" * 40, behind=2, ahead=0, remote_reached=True,
                  remote="origin")


def test_local_refusals_in_order() -> None:
    assert update.local_refusal(BASE, Options()) is None
    detached = replace(BASE, branch=None, upstream=None)
    assert isinstance(update.local_refusal(detached, Options()), errors.UpdateRefused)
    lonely = replace(BASE, upstream=None)
    assert "no upstream" in update.local_refusal(lonely, Options()).message
    dirty = replace(BASE, dirty_files=("a.py", "b.py"))
    refusal = update.local_refusal(dirty, Options())
    assert isinstance(refusal, errors.DirtyTree) and "a.py" in refusal.message
    assert update.local_refusal(dirty, Options(force=True)) is None


def test_remote_refusals() -> None:
    assert update.remote_refusal(BASE) is None
    offline = replace(BASE, fetch_error="Could not resolve host", remote_reached=False)
    assert "Could not resolve host" in update.remote_refusal(offline).message
    diverged = replace(BASE, ahead=1)
    assert isinstance(update.remote_refusal(diverged), errors.UpdateRefused)
    gone = replace(BASE, upstream_commit=None, behind=None, ahead=None)
    assert isinstance(update.remote_refusal(gone), errors.UpdateRefused)


def test_decide_turns_refusals_into_warnings_with_auto() -> None:
    refusal = errors.UpdateRefused("diverged")
    assert update.decide(refusal, BASE, Options()).refusal is refusal
    auto = update.decide(refusal, BASE, Options(auto=True))
    assert auto.refusal is None and not auto.pull and "diverged" in auto.warnings[0]
    assert update.decide(None, BASE, Options()).pull is True
    assert update.decide(None, replace(BASE, behind=0), Options()).pull is False


def test_many_dirty_files_are_listed_with_a_count() -> None:
    files = tuple(f"f{i}.py" for i in range(25))
    message = update.dirty_error(files).message
    assert "f19.py" in message and "f20.py" not in message and "5 more" in message


# --- git's environment and output -----------------------------------------------------


def test_network_env_never_prompts() -> None:
    env = repo.network_env(7, {})
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert env["GIT_ASKPASS"] == "" and env["SSH_ASKPASS"] == ""
    assert (env["GIT_CONFIG_COUNT"], env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"]) == (
        "1", "credential.helper", "")
    assert env["GIT_SSH_COMMAND"] == "ssh -o BatchMode=yes -o ConnectTimeout=7"
    assert env["GIT_HTTP_LOW_SPEED_TIME"] == "7"


def test_network_env_extends_the_users_settings() -> None:
    env = repo.network_env(5, {"GIT_CONFIG_COUNT": "2", "GIT_SSH_COMMAND": "ssh -i key"})
    assert env["GIT_CONFIG_COUNT"] == "3" and env["GIT_CONFIG_KEY_2"] == "credential.helper"
    assert env["GIT_SSH_COMMAND"].startswith("ssh -i key -o BatchMode=yes")
    assert "GIT_SSH_COMMAND" not in repo.network_env(5, {"GIT_SSH": "/usr/bin/plink"})
    assert repo.network_env(5, {}, ssh_command="ssh -p 2222")["GIT_SSH_COMMAND"].startswith(
        "ssh -p 2222 -o BatchMode=yes")


def test_parse_porcelain() -> None:
    text = " M README.md\0M  staged.py\0 D gone.txt\0R  new name.py\0old name.py\0"
    assert repo.parse_porcelain(text) == (
        "README.md", "staged.py", "gone.txt", "new name.py", "old name.py")
    assert repo.parse_porcelain("") == ()


def test_timeout_from_env() -> None:
    assert repo.timeout_from_env({}) == repo.DEFAULT_TIMEOUT
    assert repo.timeout_from_env({repo.TIMEOUT_ENV: "3.5"}) == 3.5
    for bad in ("soon", "0", "-1"):
        with pytest.raises(errors.ManagerError):
            repo.timeout_from_env({repo.TIMEOUT_ENV: bad})


# --- running-job records --------------------------------------------------------------


def test_running_jobs_reads_live_records_and_ignores_stale_ones(tmp_path: Path) -> None:
    folder = tmp_path / ".aitk-run"
    folder.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        record = {"pid": live.pid, "name": "my_lora", "config": "config/my_lora.yml",
                  "started": "2026-01-01T00:00:00Z"}
        (folder / f"{live.pid}.json").write_text(json.dumps(record))
        (folder / f"{dead.pid}.json").write_text(json.dumps({**record, "pid": dead.pid}))
        (folder / "notes.json").write_text("{}")  # not a job record
        jobs = running_jobs(tmp_path)
        assert [(j.pid, j.name) for j in jobs] == [(live.pid, "my_lora")]
        assert "my_lora" in jobs[0].describe() and str(live.pid) in jobs[0].describe()
    finally:
        live.kill()
        live.wait()
    assert running_jobs(tmp_path) == []


def test_a_damaged_record_still_names_its_pid(tmp_path: Path) -> None:
    record = tmp_path / f"{os.getpid()}.json"
    record.write_text("{not json")
    job = read_record(record)
    assert job is not None and job.pid == os.getpid() and job.name is None
    assert pid_alive(os.getpid()) and not pid_alive(0)
    assert running_jobs(tmp_path / "missing") == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")
def test_an_exited_but_unreaped_job_is_not_running() -> None:
    import time

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(100):  # wait until it has exited (it stays a zombie: no wait())
            if Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert not pid_alive(child.pid)
    finally:
        child.wait()


# --- the runner's own_group mode (used for network git) -------------------------------


@pytest.mark.skipif(os.name == "nt", reason="uses sh")
def test_a_timeout_kills_the_whole_group_even_a_helper_holding_the_pipes() -> None:
    import time

    from manager import process

    # Like git leaving git-remote-https behind: the helper keeps stdout open.
    done = process.run(["sh", "-c", "sleep 300 & echo $!; wait"], timeout=1, own_group=True)
    assert done.timed_out and not done.ok
    helper = int(done.stdout.split()[0])
    for _ in range(50):  # the kill is immediate; reaping by init may take a moment
        if not pid_alive(helper):
            break
        time.sleep(0.1)
    assert not pid_alive(helper)


def test_own_group_reports_exit_codes_and_missing_programs() -> None:
    from manager import process

    assert process.run([sys.executable, "-c", "print('hi')"], own_group=True).stdout == "hi\n"
    assert process.run([sys.executable, "-c", "raise SystemExit(4)"],
                       own_group=True).returncode == 4
    assert process.run(["/nonexistent/program"], own_group=True).returncode == 127
