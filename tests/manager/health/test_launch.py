"""`manager launch`: the trainer's exit code, signals to its process group, the checks
before it starts. The trainer is a stand-in run.py in the temporary checkout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.manager.health.conftest import REPO

# Records what it was given, then acts as its config (JSON) says.
STAND_IN = r'''
import json, os, signal, subprocess, sys, time
out = os.environ["AITK_TEST_OUT"]
config = json.load(open(sys.argv[-1]))
with open(os.path.join(out, "argv.json"), "w") as fh:
    json.dump({"argv": sys.argv, "cwd": os.getcwd(), "pgid": os.getpgid(0),
               "pythonpath": os.environ.get("PYTHONPATH"),
               "tool_var": os.environ.get("AITK_TEST_TOOL"),
               "python": sys.executable}, fh)
if config.get("wait"):
    def stop(signum, frame):
        with open(os.path.join(out, "signals"), "a") as fh:
            fh.write(signal.Signals(signum).name + "\n")
        if not config.get("stubborn"):
            sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.path.join(out, "worker"), "w") as fh:
        fh.write(str(worker.pid))
    open(os.path.join(out, "ready"), "w").close()
    while True:
        time.sleep(0.05)
sys.exit(config.get("exit", 0))
'''


@pytest.fixture
def trainer(healthy, tmp_path, monkeypatch):
    (healthy.root / "run.py").write_text(STAND_IN, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("AITK_TEST_OUT", str(out))
    return out


def config(folder: Path, name: str, **body: object) -> Path:
    path = folder / name
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def recorded(out: Path) -> dict:
    return json.loads((out / "argv.json").read_text())


def test_trainer_exit_code_is_the_launchers(healthy, trainer, tmp_path, run_cli, monkeypatch):
    job = config(tmp_path, "job three.yaml", exit=3)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("launch", job.name)
    assert code == 3, err
    seen = recorded(trainer)
    assert seen["argv"] == [str(healthy.root / "run.py"), str(job)]  # made absolute
    assert seen["cwd"] == str(healthy.root)
    assert Path(seen["python"]).parent == healthy.venv / "bin"
    assert seen["pgid"] != os.getpgid(0)  # its own process group


def test_environment_is_clean_and_has_the_tools(healthy, trainer, tmp_path, run_cli, monkeypatch):
    from manager import tools

    monkeypatch.setattr(tools, "child_env", lambda paths: {"AITK_TEST_TOOL": "ffmpeg-here"})
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    code, _, _ = run_cli("launch", str(config(tmp_path, "job.yaml")))
    assert code == 0
    seen = recorded(trainer)
    assert seen["pythonpath"] is None
    assert seen["tool_var"] == "ffmpeg-here"


def test_example_runs_the_bundled_example_job(healthy, trainer, run_cli):
    example = healthy.root / "config" / "examples" / "train_lora_example_cpu.yaml"
    example.parent.mkdir(parents=True)
    example.write_text(json.dumps({"exit": 0}), encoding="utf-8")
    code, _, _ = run_cli("launch", "--example")
    assert code == 0
    assert recorded(trainer)["argv"][-1] == str(example)


SERVER_STAND_IN = r'''
import json, os, sys
with open(os.path.join(os.environ["AITK_TEST_OUT"], "server.json"), "w") as fh:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "pgid": os.getpgid(0)}, fh)
sys.exit(0)
'''


@pytest.mark.parametrize(("args", "server_args"), [
    ((), []), (("--listen", "--port", "9000", "--no-browser"),
               ["--listen", "--port", "9000", "--no-browser"]),
    (("--port=0",), ["--port", "0"]),
    (("--allowed-host", "box.lan", "--allowed-host=proxy"),
     ["--allowed-host", "box.lan", "--allowed-host", "proxy"])])
def test_without_configs_serves_the_web_ui(healthy, trainer, run_cli, args, server_args):
    (healthy.root / "aitk_server").mkdir()
    (healthy.root / "aitk_server" / "__init__.py").write_text("")
    (healthy.root / "aitk_server" / "__main__.py").write_text(SERVER_STAND_IN)
    code, _, err = run_cli("launch", *args)
    assert code == 0, err
    seen = json.loads((trainer / "server.json").read_text())
    assert seen["argv"] == server_args and seen["cwd"] == str(healthy.root)
    assert seen["pgid"] != os.getpgid(0)  # its own group: Ctrl+C is forwarded once


@pytest.mark.parametrize("args", [("--port", "http"), ("--port", "70000"),
                                  ("--listen", "job.yaml"), ("--example", "--no-browser"),
                                  ("--allowed-host", "box.lan", "job.yaml")])
def test_bad_ui_flags_are_usage_errors(healthy, trainer, run_cli, args):
    code, _, err = run_cli("launch", *args)
    assert code == 2 and "--port" in err and "Traceback" not in err
    assert not (trainer / "argv.json").exists()  # nothing was started


def test_out_of_sync_warns_and_starts(healthy, trainer, tmp_path, run_cli, monkeypatch):
    from manager import envstatus

    monkeypatch.setattr(envstatus, "quick_status", lambda paths, cpu=None:
                        envstatus.SyncStatus(False, ("requirements.txt changed",)))
    code, _, err = run_cli("launch", str(config(tmp_path, "job.yaml", exit=0)))
    assert code == 0
    assert "out of sync: requirements.txt changed" in err
    assert "python3 -m manager sync" in err


def test_corrupt_state_warns_with_its_own_fix_and_starts(healthy, trainer, tmp_path, run_cli):
    (healthy.venv / "aitk_manager_state.json").write_text("{not json", encoding="utf-8")
    code, _, err = run_cli("launch", str(config(tmp_path, "job.yaml", exit=3)))
    assert code == 3  # still the trainer's code: a bad state file does not block training
    lines = err.strip().splitlines()
    assert "is corrupt" in lines[0]
    assert "sync --verify" in lines[1] and lines[1].endswith("starting anyway")
    assert "GPU" not in err  # not a guess from the spec refusing a lost --cpu choice
    assert (healthy.venv / "aitk_manager_state.json").read_text() == "{not json"


def test_state_nested_2000_deep_warns_and_starts(healthy, trainer, tmp_path, run_cli):
    """Issue 14: a RecursionError in the JSON parser is a corrupt state, not a crash."""
    (healthy.venv / "aitk_manager_state.json").write_text("[" * 2000 + "]" * 2000)
    code, _, err = run_cli("launch", str(config(tmp_path, "job.yaml", exit=3)))
    assert code == 3, err
    assert "Traceback" not in err and "is corrupt" in err.splitlines()[0]


def test_missing_venv_is_a_one_line_hint(healthy, trainer, tmp_path, run_cli):
    import shutil

    shutil.rmtree(healthy.venv)
    code, out, err = run_cli("launch", str(config(tmp_path, "job.yaml")))
    assert code == 1
    assert err.strip().splitlines() == [
        "aitk: error: nothing is installed in this checkout yet: run ./install.sh "
        "(or python3 -m manager install) first"]
    assert not (trainer / "argv.json").exists()


def test_other_arguments_reach_run_py_as_given(healthy, trainer, tmp_path, run_cli,
                                               monkeypatch):
    job = config(tmp_path, "job.yaml", exit=0)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("launch", "my_job", "--recover", "--name", "x", "job.yaml")
    assert code == 0, err
    assert recorded(trainer)["argv"][1:] == ["my_job", "--recover", "--name", "x", str(job)]


def start_launcher(healthy, trainer, job: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "AITK_ROOT": str(healthy.root), "AITK_NO_BOOTSTRAP": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "manager", "launch", str(job)],
                                cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (trainer / "ready").exists():
        assert launcher.poll() is None, launcher.stderr.read()
        assert time.monotonic() < deadline, "the stand-in trainer never started"
        time.sleep(0.05)
    return launcher


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(os.name == "nt", reason="POSIX process groups")
def test_sigint_is_forwarded_to_the_group(healthy, trainer, tmp_path):
    launcher = start_launcher(healthy, trainer, config(tmp_path, "job.yaml", wait=True))
    os.kill(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl+C sends the launcher
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert (trainer / "signals").read_text() == "SIGINT\n"  # once, not twice
    assert recorded(trainer)["pgid"] not in (os.getpgid(0), launcher.pid)
    worker = int((trainer / "worker").read_text())
    deadline = time.monotonic() + 30
    while not gone(worker):  # the group is stopped along with the trainer
        assert time.monotonic() < deadline, "the trainer's worker outlived it"
        time.sleep(0.05)


@pytest.mark.skipif(os.name == "nt", reason="POSIX process groups")
def test_second_ctrl_c_kills_a_stuck_trainer(healthy, trainer, tmp_path):
    launcher = start_launcher(healthy, trainer,
                              config(tmp_path, "job.yaml", wait=True, stubborn=True))
    os.kill(launcher.pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while not (trainer / "signals").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGKILL, err
    assert "press Ctrl+C again" in err


def test_install_json_keeps_the_trainers_output_off_stdout(healthy, trainer, tmp_path,
                                                           monkeypatch, capfd):
    """`install --json` prints its envelope, then launches: the trainer's stdout goes to
    stderr so stdout stays one JSON document."""
    from manager.commands import launch, sync
    from manager.output import Result

    monkeypatch.setattr(sync, "run", lambda options: Result(data={"changes": []}))
    real_run = launch.run
    chatty = config(tmp_path, "job.yaml", exit=0)

    def run_with_a_chatty_job(options):
        (healthy.root / "run.py").write_text("print('step 1/1 loss 0.5')\n", encoding="utf-8")
        return real_run(launch.Options(configs=(str(chatty),),
                                       stdout_to_stderr=options.stdout_to_stderr))

    monkeypatch.setattr(launch, "run", run_with_a_chatty_job)
    from manager.cli import main

    code = main(["install", "--json"])
    out, err = capfd.readouterr()  # file-descriptor level: the trainer's output too
    assert code == 0
    assert json.loads(out)["command"] == "install"  # nothing but the envelope
    assert "step 1/1 loss 0.5" in err


# Issue 14: a trainer that saves on HUP (as aitk does) and takes a while to save.
SAVING_STAND_IN = r'''
import os, signal, sys, time
out = os.environ["AITK_TEST_OUT"]
def stop(signum, frame):
    with open(os.path.join(out, "signals"), "a") as fh:
        fh.write(signal.Signals(signum).name + "\n")
    while not os.path.exists(os.path.join(out, "release")):  # "saving"
        time.sleep(0.05)
    sys.exit(130)
for name in ("SIGINT", "SIGTERM", "SIGHUP"):
    signal.signal(getattr(signal, name), stop)
open(os.path.join(out, "ready"), "w").close()
while True:
    time.sleep(0.05)
'''


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_closing_the_terminal_forwards_hup_and_waits_for_the_save(healthy, trainer, tmp_path):
    """SIGHUP reaches the launcher when its terminal closes; by then its stderr leads
    nowhere (here: pipes whose reading ends are closed). The trainer must still get the
    HUP, once, and the launcher must wait for it to finish saving."""
    (healthy.root / "run.py").write_text(SAVING_STAND_IN, encoding="utf-8")
    env = {**os.environ, "AITK_ROOT": str(healthy.root), "AITK_NO_BOOTSTRAP": "1"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "manager", "launch", str(config(tmp_path, "job.yaml"))],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (trainer / "ready").exists():
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    launcher.stdout.close()  # the terminal is gone
    launcher.stderr.close()
    os.kill(launcher.pid, signal.SIGHUP)
    while not (trainer / "signals").exists():
        assert time.monotonic() < deadline, "the trainer never got a signal"
        time.sleep(0.05)
    assert launcher.poll() is None  # still waiting for the trainer's save
    (trainer / "release").touch()
    assert launcher.wait(timeout=60) == 130
    assert (trainer / "signals").read_text() == "SIGHUP\n"


def test_on_windows_every_stop_reaches_the_trainers_group_as_ctrl_break():
    """Issue 14 (the decisions, tested on Linux): on Windows the launcher catches
    SIGINT, SIGTERM and SIGBREAK (there is no SIGHUP), starts the trainer in a new process
    group and sends that group CTRL_BREAK_EVENT for any of them (the trainer sees SIGBREAK,
    one of its stop-and-save signals: tests/aitk/test_job_signals.py); elsewhere the
    group gets the very signal the launcher caught."""
    from types import SimpleNamespace

    from aitk_common import procs
    from manager.commands import launch

    windows = SimpleNamespace(SIGINT=2, SIGTERM=15, SIGBREAK=21, SIGABRT=22)
    assert launch.forwarded_signals(windows) == (2, 15, 21)
    assert {procs.signal_for_group("nt", s) for s in (2, 15, 21)} == {1}  # CTRL_BREAK_EVENT
    assert procs.group_options("nt") == {"creationflags": 0x200}  # CREATE_NEW_PROCESS_GROUP

    here = launch.forwarded_signals()
    assert set(here) >= {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    assert [procs.signal_for_group("posix", s) for s in here] == list(here)
    assert procs.group_options("posix") == {"start_new_session": True}
