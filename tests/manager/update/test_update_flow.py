"""`manager update` end to end: real git, a bare remote, the manager run as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from manager import errors

if TYPE_CHECKING:  # a type only: several conftest modules may exist
    from tests.manager.update.conftest import Checkout

# --- the happy path -------------------------------------------------------------------


def test_fast_forward_runs_the_new_codes_sync_with_every_flag(checkout: Checkout) -> None:
    new = checkout.push_new_code()
    (checkout.path / "scratch-notes.txt").write_text("untracked, mine\n")

    done = checkout.manager("update", "--cpu")

    assert done.returncode == 0, done.stderr
    assert checkout.head() == new
    # The sync that ran is the pulled code (MARK v2), with --cpu forwarded ...
    calls = checkout.sync_calls()
    assert [c["mark"] for c in calls] == ["v2"]
    assert calls[0]["args"] == ["--cpu"]
    # ... and it applied the migration that only exists upstream, recording it.
    assert "900_upstream_marker" in calls[0]["applied"]
    assert (checkout.path / "upstream-migration-ran").read_text() == "ran\n"
    state = json.loads((checkout.path / ".venv" / "aitk_manager_state.json").read_text())
    assert "900_upstream_marker" in state["migrations"]
    assert (checkout.path / "scratch-notes.txt").read_text() == "untracked, mine\n"
    assert "updated main" in done.stdout

    # A second update: nothing to pull, the sync runs again, the migration does not.
    again = checkout.manager("update")
    assert again.returncode == 0, again.stderr
    assert (checkout.path / "upstream-migration-ran").read_text() == "ran\n"
    assert checkout.sync_calls()[-1] == {"mark": "v2", "args": [], "applied": []}
    assert "up to date" in again.stdout


def test_untracked_files_do_not_block_the_update(checkout: Checkout) -> None:
    new = checkout.push_upstream({"notes.txt": "upstream edit\n"}, "edit notes")
    (checkout.path / "my-config.yml").write_text("mine: true\n")
    (checkout.path / "output").mkdir()
    (checkout.path / "output" / "lora.safetensors").write_bytes(b"\x00weights")

    done = checkout.manager("update")

    assert done.returncode == 0, done.stderr
    assert checkout.head() == new
    assert (checkout.path / "notes.txt").read_text() == "upstream edit\n"
    assert (checkout.path / "my-config.yml").read_text() == "mine: true\n"
    assert (checkout.path / "output" / "lora.safetensors").read_bytes() == b"\x00weights"


# --- local work is never touched ------------------------------------------------------


def _modify(c: Checkout) -> None:
    (c.path / "README.md").write_text("my local edit\n")


def _stage(c: Checkout) -> None:
    (c.path / "notes.txt").write_text("staged edit\n")
    c.git("add", "notes.txt")


def _delete(c: Checkout) -> None:
    (c.path / "README.md").unlink()


@pytest.mark.parametrize(("make_dirty", "listed"), [
    (_modify, "README.md"), (_stage, "notes.txt"), (_delete, "README.md"),
], ids=["modified", "staged", "deleted"])
def test_dirty_tree_aborts_and_changes_nothing(checkout: Checkout, make_dirty, listed) -> None:
    checkout.push_new_code()
    make_dirty(checkout)
    before = checkout.snapshot()

    done = checkout.manager("update")

    assert done.returncode == errors.DirtyTree.exit_code
    assert listed in done.stderr
    assert "stash" in done.stderr  # the hint
    assert checkout.snapshot() == before  # HEAD, diffs and every byte unchanged
    assert checkout.sync_calls() == []


def test_acceptance_local_edit_git_diff_identical(checkout: Checkout) -> None:
    """Done-when: a local edit to a tracked file -> non-zero exit, `git diff` identical."""
    _modify(checkout)
    diff_before = checkout.git("diff")

    done = checkout.manager("update")

    assert done.returncode != 0
    assert checkout.git("diff") == diff_before


def test_auto_on_a_dirty_tree_warns_skips_the_pull_and_still_syncs(checkout: Checkout) -> None:
    checkout.push_new_code()
    _modify(checkout)
    before = checkout.snapshot()

    done = checkout.manager("update", "--auto", "--cpu")

    assert done.returncode == 0, done.stderr
    assert "warning" in done.stderr and "README.md" in done.stderr
    assert checkout.snapshot() == before
    assert [(c["mark"], c["args"]) for c in checkout.sync_calls()] == [("v1", ["--cpu"])]


def test_force_fast_forwards_around_unrelated_local_changes(checkout: Checkout) -> None:
    new = checkout.push_upstream({"notes.txt": "upstream edit\n"}, "edit notes")
    _modify(checkout)  # README.md: not touched upstream

    done = checkout.manager("update", "--force")

    assert done.returncode == 0, done.stderr
    assert checkout.head() == new
    assert (checkout.path / "README.md").read_text() == "my local edit\n"


def test_force_still_lets_git_refuse_to_overwrite(checkout: Checkout) -> None:
    checkout.push_upstream({"README.md": "upstream edit\n"}, "edit readme")
    _modify(checkout)  # the same file
    before = checkout.snapshot()

    done = checkout.manager("update", "--force")

    assert done.returncode == errors.DirtyTree.exit_code
    assert "README.md" in done.stderr
    assert checkout.snapshot() == before
    assert checkout.sync_calls() == []


def test_an_untracked_file_in_the_way_is_not_overwritten(checkout: Checkout) -> None:
    checkout.push_upstream({"new-file.txt": "upstream\n"}, "add a file")
    (checkout.path / "new-file.txt").write_text("mine\n")
    head = checkout.head()

    done = checkout.manager("update")

    assert done.returncode == errors.DirtyTree.exit_code
    assert "new-file.txt" in done.stderr
    assert (checkout.path / "new-file.txt").read_text() == "mine\n"
    assert checkout.head() == head


# --- histories update cannot follow ---------------------------------------------------


def test_diverged_history_is_refused(checkout: Checkout) -> None:
    checkout.push_upstream({"notes.txt": "upstream\n"}, "upstream commit")
    (checkout.path / "README.md").write_text("local commit\n")
    checkout.git("commit", "-qam", "local commit")
    head = checkout.head()

    done = checkout.manager("update")
    assert done.returncode == errors.UpdateRefused.exit_code
    assert "diverged" in done.stderr
    assert checkout.head() == head

    auto = checkout.manager("update", "--auto")
    assert auto.returncode == 0, auto.stderr
    assert "diverged" in auto.stderr and "warning" in auto.stderr
    assert checkout.head() == head
    assert [c["mark"] for c in checkout.sync_calls()] == ["v1"]


def test_detached_head_is_refused(checkout: Checkout) -> None:
    checkout.push_new_code()
    checkout.git("checkout", "-q", "--detach")
    head = checkout.head()

    done = checkout.manager("update")
    assert done.returncode == errors.UpdateRefused.exit_code
    assert "detached" in done.stderr
    assert checkout.head() == head

    auto = checkout.manager("update", "--auto")
    assert auto.returncode == 0 and "detached" in auto.stderr
    assert checkout.head() == head


def test_branch_without_upstream_is_refused(checkout: Checkout) -> None:
    checkout.git("switch", "-q", "-c", "experiment")  # no upstream
    done = checkout.manager("update")
    assert done.returncode == errors.UpdateRefused.exit_code
    assert "no upstream" in done.stderr
    assert "--set-upstream-to" in done.stderr


@pytest.fixture
def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: connections are refused


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A loopback HTTP "server" that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_unreachable_remote_fails_with_a_clear_message(checkout: Checkout,
                                                       refused_port: int) -> None:
    checkout.git("remote", "set-url", "origin", f"http://127.0.0.1:{refused_port}/aitk.git")
    head = checkout.head()

    done = checkout.manager("update")
    assert done.returncode == errors.ManagerError.exit_code
    assert "could not fetch from the remote 'origin'" in done.stderr
    assert checkout.head() == head

    auto = checkout.manager("update", "--auto")
    assert auto.returncode == 0 and "could not fetch" in auto.stderr
    assert [c["mark"] for c in checkout.sync_calls()] == ["v1"]


def test_a_remote_that_never_answers_times_out(checkout: Checkout, black_hole: int) -> None:
    checkout.git("remote", "set-url", "origin", f"http://127.0.0.1:{black_hole}/aitk.git")

    done = checkout.manager("update", extra_env={"AITK_GIT_TIMEOUT": "2"})

    assert done.returncode == errors.ManagerError.exit_code
    assert "could not fetch from the remote" in done.stderr, done.stderr
    assert "no answer within 2 s" in done.stderr


def test_credentials_are_never_prompted_for(checkout: Checkout) -> None:
    """A remote that asks for credentials: git must fail, not wait on a prompt."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class AuthRequired(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="aitk"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), AuthRequired)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/aitk.git"
        checkout.git("remote", "set-url", "origin", url)
        # A credential helper and an askpass program that would answer (or pop a window).
        ran = checkout.path.parent / "prompted"
        script = checkout.path.parent / "askpass.sh"
        script.write_text(f"#!/bin/sh\necho askpass >> {ran}\necho secret\n")
        script.chmod(0o755)
        checkout.git("config", "core.askPass", str(script))
        checkout.git("config", "credential.helper", f"!{script}")
        done = checkout.manager("update", extra_env={"AITK_GIT_TIMEOUT": "20"})
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == errors.ManagerError.exit_code
    assert "could not fetch from the remote" in done.stderr, done.stderr
    assert "no answer within" not in done.stderr  # it failed; it did not wait
    assert not ran.exists()


# --- dry run and running jobs ---------------------------------------------------------


def test_dry_run_shows_incoming_and_pulls_nothing(checkout: Checkout) -> None:
    checkout.push_new_code()
    before = checkout.snapshot()

    done = checkout.manager("update", "--dry-run", "--cpu")

    assert done.returncode == 0, done.stderr
    assert checkout.snapshot() == before
    assert "upstream: new sync and a migration" in done.stdout
    assert "nothing was pulled" in done.stdout
    assert "then: python3 -m manager sync --cpu" in done.stdout
    # The current code's sync was asked for its plan, with both flags forwarded.
    assert checkout.sync_calls() == [{"mark": "v1", "args": ["--dry-run", "--cpu"],
                                      "applied": []}]
    assert not (checkout.path / "upstream-migration-ran").exists()


def _write_job(checkout: Checkout, pid: int, name: str) -> None:
    folder = checkout.path / ".aitk-run"
    folder.mkdir(exist_ok=True)
    record = {"pid": pid, "name": name, "config": "config/my_lora.yml",
              "started": "2026-01-01T00:00:00Z"}
    (folder / f"{pid}.json").write_text(json.dumps(record))


def test_update_refuses_while_a_training_job_runs(checkout: Checkout) -> None:
    checkout.push_new_code()
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_job(checkout, job.pid, "my_lora")
        head = checkout.head()

        done = checkout.manager("update")
        assert done.returncode == errors.UpdateRefused.exit_code
        assert "my_lora" in done.stderr and str(job.pid) in done.stderr
        assert checkout.head() == head

        auto = checkout.manager("update", "--auto")
        assert auto.returncode == 0 and "my_lora" in auto.stderr
        assert checkout.head() == head
        assert checkout.sync_calls() == []  # no sync under a running job either
    finally:
        job.kill()
        job.wait()


def test_a_stale_job_record_is_ignored(checkout: Checkout) -> None:
    new = checkout.push_new_code()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: the pid is free
    _write_job(checkout, gone.pid, "finished_long_ago")

    done = checkout.manager("update")

    assert done.returncode == 0, done.stderr
    assert checkout.head() == new


def test_a_failing_sync_fails_the_update(checkout: Checkout) -> None:
    broken = ('from manager import errors\nfrom manager.cli import _finish, app\n\n\n'
              '@app.command()\ndef sync(cpu: bool = False) -> None:\n'
              '    def fail():\n        raise errors.UnsupportedMachine("no such GPU")\n\n'
              '    _finish("sync", fail, False)\n')
    new = checkout.push_upstream({"manager/cli/env.py": broken}, "a sync that fails")

    done = checkout.manager("update")

    assert checkout.head() == new
    assert done.returncode == 3
    assert "the sync after the update failed" in done.stderr


def test_not_a_git_checkout_is_one_clear_line(tmp_path, checkout: Checkout) -> None:
    done = checkout.manager("update", extra_env={"AITK_ROOT": str(tmp_path)})
    assert done.returncode == 1
    assert "is not a git checkout" in done.stderr
    assert "Traceback" not in done.stderr


def test_auto_outside_a_git_checkout_warns_and_still_syncs(checkout: Checkout) -> None:
    """A zip download started from the desktop launcher: nothing to pull, the sync runs."""
    shutil.move(checkout.path / ".git", checkout.scratch / "moved.git")
    done = checkout.manager("update", "--auto", "--cpu")
    assert done.returncode == 0, done.stderr
    assert "warning: update skipped:" in done.stderr and "not a git checkout" in done.stderr
    assert "Traceback" not in done.stderr
    assert [(c["mark"], c["args"]) for c in checkout.sync_calls()] == [("v1", ["--cpu"])]


def test_sync_interpreter_bypasses_nothing_by_default() -> None:
    from manager.commands import update

    assert update.interpreter({"AITK_NO_BOOTSTRAP": "1"}) == sys.executable
    chosen = update.interpreter({})
    assert os.path.exists(chosen)


def test_a_token_in_the_remote_url_is_never_shown_by_update(checkout: Checkout,
                                                             refused_port: int) -> None:
    checkout.git("remote", "set-url", "origin",
                 f"http://127.0.0.1:{refused_port}/aitk.git?access_token=ghp_query456")
    done = checkout.manager("update")
    assert done.returncode == errors.ManagerError.exit_code
    assert "could not fetch from the remote 'origin'" in done.stderr
    assert "ghp_query456" not in done.stdout + done.stderr
    assert "access_token=***" in done.stderr
    auto = checkout.manager("update", "--auto", "--json")
    assert "ghp_query456" not in auto.stdout + auto.stderr
