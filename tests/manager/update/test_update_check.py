"""`manager check [--json]`: the answer and the exit code in each situation."""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

import pytest

from aitk_common.files import atomic_write_json
from manager import envstatus, errors, migrations
from manager.cli import main
from manager.envstatus import SyncStatus

if TYPE_CHECKING:  # a type only: several conftest modules may exist
    from tests.manager.update.conftest import Checkout


@pytest.fixture
def synced(in_checkout: Checkout, monkeypatch: pytest.MonkeyPatch) -> Checkout:
    """Dependencies in sync and every migration applied: nothing is due locally."""
    monkeypatch.setattr(envstatus, "quick_status", lambda paths, cpu=None: SyncStatus(True))
    state = {"version": 1, "migrations": [m.id for m in migrations.available()]}
    atomic_write_json(in_checkout.path / ".venv" / "aitk_manager_state.json", state)
    return in_checkout


def check_json(capture: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["check", "--json"])
    out = capture.readouterr().out
    envelope = json.loads(out)  # stdout holds only the envelope
    assert envelope["exit_code"] == code
    return code, envelope


def test_nothing_due_exits_0(synced: Checkout, capsys) -> None:
    code, env = check_json(capsys)
    data = env["data"]
    assert code == errors.EXIT_OK
    assert data["branch"] == "main" and data["upstream"] == "origin/main"
    assert data["commit"] == synced.head() == data["upstream_commit"]
    assert (data["behind"], data["ahead"]) == (0, 0)
    assert data["remote_reached"] is True
    assert data["update_available"] is False and data["sync_due"] is False
    assert data["dirty"] is False and data["pending_migrations"] == []
    assert data["in_the_way"] == [] and data["problems"] == []
    assert data["version"]


def test_update_available_exits_10_with_the_incoming_log(synced: Checkout, capsys) -> None:
    for i in range(22):
        new = synced.push_upstream({"notes.txt": f"edit {i}\n"}, f"upstream change {i}")

    code, env = check_json(capsys)
    data = env["data"]
    assert code == errors.EXIT_UPDATE_AVAILABLE
    assert data["update_available"] is True
    assert data["behind"] == 22 and data["upstream_commit"] == new
    assert len(data["incoming"]) == 20  # capped, one line each, newest first
    assert data["incoming"][0].endswith("upstream change 21")
    assert synced.head() != new  # check pulls nothing


def test_an_ignored_file_the_update_would_overwrite_is_a_problem_with_its_fix(
        synced: Checkout, capfd) -> None:
    """Issue 14: `update` refuses (exit 6, naming the paths) when the incoming commits add
    a file where the user has one git does not track; `check` says so before."""
    synced.push_upstream({"output/result.txt": "upstream placeholder\n"},
                         "ship a placeholder in output/")
    (synced.path / "output").mkdir()
    (synced.path / "output" / "result.txt").write_text("my training result\n")

    code, env = check_json(capfd)
    data = env["data"]
    assert code == errors.EXIT_UPDATE_AVAILABLE
    assert data["update_available"] is True
    assert data["in_the_way"] == ["output/result.txt"]
    [problem] = data["problems"]
    assert "output/result.txt" in problem["problem"] and "overwrite" in problem["problem"]
    assert problem["fix"] == "move or rename them, then run `python3 -m manager update`"
    assert (synced.path / "output" / "result.txt").read_text() == "my training result\n"

    assert main(["check"]) == errors.EXIT_UPDATE_AVAILABLE
    out = capfd.readouterr().out
    assert "output/result.txt" in out and "fix: move or rename them" in out
    assert out.strip().splitlines()[-1] != "run `python3 -m manager update`"  # it refuses
    refused = synced.manager("update")  # what check foretold
    assert refused.returncode == errors.DirtyTree.exit_code
    assert "output/result.txt" in refused.stderr


def test_sync_due_exits_11(synced: Checkout, capsys, monkeypatch) -> None:
    monkeypatch.setattr(envstatus, "quick_status",
                        lambda paths, cpu=None: SyncStatus(False, ("requirements.txt changed",)))
    code, env = check_json(capsys)
    assert code == errors.EXIT_SYNC_DUE
    assert env["data"]["deps_in_sync"] is False
    assert env["data"]["deps_reasons"] == ["requirements.txt changed"]


def test_a_pending_migration_makes_a_sync_due(synced: Checkout, capsys) -> None:
    atomic_write_json(synced.path / ".venv" / "aitk_manager_state.json",
                      {"version": 1, "migrations": []})
    code, env = check_json(capsys)
    assert code == errors.EXIT_SYNC_DUE
    assert env["data"]["pending_migrations"] == migrations.pending([])


def test_update_wins_over_sync(synced: Checkout, capsys, monkeypatch) -> None:
    monkeypatch.setattr(envstatus, "quick_status", lambda paths, cpu=None: SyncStatus(False))
    synced.push_upstream({"notes.txt": "x\n"}, "upstream")
    code, _ = check_json(capsys)
    assert code == errors.EXIT_UPDATE_AVAILABLE


def test_dirty_tree_is_reported_not_an_error(synced: Checkout, capsys) -> None:
    (synced.path / "README.md").write_text("local\n")
    (synced.path / "untracked.txt").write_text("not counted\n")
    code, env = check_json(capsys)
    assert code == errors.EXIT_OK
    assert env["data"]["dirty"] is True
    assert env["data"]["dirty_files"] == ["README.md"]


def test_offline_says_so_and_answers_from_the_last_fetch(synced: Checkout, capsys) -> None:
    synced.push_upstream({"notes.txt": "x\n"}, "upstream")
    synced.git("fetch", "-q")  # known from an earlier fetch ...
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    synced.git("remote", "set-url", "origin", f"http://127.0.0.1:{port}/aitk.git")  # ... now gone

    code, env = check_json(capsys)
    data = env["data"]
    assert code == errors.EXIT_UPDATE_AVAILABLE
    assert data["remote_reached"] is False and data["behind"] == 1
    assert any("was not reached" in note for note in data["notes"])
    assert any("not reached" in message for message in env["messages"])

    assert main(["check"]) == errors.EXIT_UPDATE_AVAILABLE  # people see it on stderr
    assert "not reached" in capsys.readouterr().err


def test_offline_with_nothing_known_due_exits_0(synced: Checkout, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    synced.git("remote", "set-url", "origin", f"http://127.0.0.1:{port}/aitk.git")
    code, env = check_json(capsys)
    assert code == errors.EXIT_OK
    assert env["data"]["remote_reached"] is False


def test_detached_head_and_no_upstream_are_notes(synced: Checkout, capsys) -> None:
    synced.git("checkout", "-q", "--detach")
    code, env = check_json(capsys)
    assert code == errors.EXIT_OK
    assert env["data"]["branch"] is None and env["data"]["update_available"] is False
    assert any("detached" in note for note in env["data"]["notes"])

    synced.git("switch", "-q", "-c", "mine")
    code, env = check_json(capsys)
    assert code == errors.EXIT_OK
    assert any("no upstream" in note for note in env["data"]["notes"])


def test_not_a_checkout_is_an_error(synced: Checkout, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AITK_ROOT", str(tmp_path / "nowhere"))
    code = main(["check", "--json"])
    envelope = json.loads(capsys.readouterr().out)
    assert code == 1 and envelope["ok"] is False
    assert "not a git checkout" in envelope["error"]["message"]


def test_human_output(synced: Checkout, capsys) -> None:
    synced.push_upstream({"notes.txt": "x\n"}, "an incoming change")
    code = main(["check"])
    out = capsys.readouterr().out
    assert code == errors.EXIT_UPDATE_AVAILABLE
    assert "an incoming change" in out and "manager update" in out


def test_check_runs_as_a_command_without_a_gpu_or_flags(checkout: Checkout) -> None:
    """The real thing in a subprocess: no flags, no GPU, the stub/real quick_status."""
    done = checkout.process("check", "--json")
    envelope = json.loads(done.stdout)
    assert done.returncode == envelope["exit_code"]
    assert done.returncode in (errors.EXIT_OK, errors.EXIT_SYNC_DUE)
    assert envelope["data"]["update_available"] is False


def test_nothing_installed_says_to_install(in_checkout: Checkout, capsys, monkeypatch) -> None:
    """A fresh clone on a machine without a GPU: no state, so no recorded --cpu choice
    and the spec refuses; check must say to install, not ask for a sync."""
    from manager import specsource

    def refused(cpu):
        raise errors.UnsupportedMachine("no supported GPU found", hint="--cpu")

    monkeypatch.setattr(specsource, "current_spec", refused)
    assert not (in_checkout.path / ".venv" / "aitk_manager_state.json").exists()
    code, env = check_json(capsys)
    assert code == errors.EXIT_SYNC_DUE
    assert env["data"]["deps_reasons"] == [envstatus.NOT_INSTALLED]
    assert main(["check"]) == errors.EXIT_SYNC_DUE
    out = capsys.readouterr().out
    assert "nothing is installed yet" in out
    assert out.rstrip().splitlines()[-1] == "run ./install.sh (or `python3 -m manager install`)"


def test_diverged_is_an_available_update_with_a_note(synced: Checkout, capsys) -> None:
    synced.push_upstream({"notes.txt": "upstream\n"}, "upstream")
    (synced.path / "README.md").write_text("local commit\n")
    synced.git("commit", "-qam", "local")
    code, env = check_json(capsys)
    assert code == errors.EXIT_UPDATE_AVAILABLE
    assert env["data"]["diverged"] is True
    assert (env["data"]["behind"], env["data"]["ahead"]) == (1, 1)
    assert any("diverged" in note for note in env["data"]["notes"])


def test_check_never_waits_for_the_lock(synced: Checkout, capsys) -> None:
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from filelock import FileLock; "
         "lock = FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
         "time.sleep(60)", str(synced.path / ".aitk.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _ = check_json(capsys)
        assert code == errors.EXIT_OK
    finally:
        holder.kill()
        holder.wait()


def test_a_state_nested_2000_deep_is_exit_5_not_a_traceback(synced: Checkout, capsys) -> None:
    """Issue 14: json's RecursionError is a corrupt state file like any other."""
    (synced.path / ".venv" / "aitk_manager_state.json").write_text("[" * 2000 + "]" * 2000)
    code, env = check_json(capsys)
    assert code == errors.StateError.exit_code
    assert env["error"]["type"] == "StateError" and "sync --verify" in env["error"]["hint"]


def test_a_token_in_the_remote_url_is_never_shown(synced: Checkout, capsys) -> None:
    """git names the URL it could not reach, query and all (issue 21)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    synced.git("remote", "set-url", "origin",
               f"http://me:hunter2@127.0.0.1:{port}/aitk.git?access_token=ghp_query456")
    code, env = check_json(capsys)
    shown = json.dumps(env)
    assert "ghp_query456" not in shown and "hunter2" not in shown
    assert "access_token=***" in shown  # the message still says which URL failed
    main(["check"])
    out, err = capsys.readouterr()
    assert "ghp_query456" not in out + err and "access_token=***" in err
