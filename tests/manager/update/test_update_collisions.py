"""Issue 14: nothing the user did not commit is ever overwritten by `update`, and
`update --auto` keeps its promise (warn, skip the pull, still sync) when git refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from manager import errors

if TYPE_CHECKING:
    from tests.manager.update.conftest import Checkout


def _ignored_file_upstream_adds(checkout: Checkout) -> str:
    """Upstream adds output/result.txt; here output/ is git-ignored and holds the
    user's own result.txt. git alone would overwrite it silently (ignored = expendable)."""
    checkout.push_upstream({"output/result.txt": "upstream placeholder\n"},
                           "ship a placeholder in output/")
    mine = checkout.path / "output" / "result.txt"
    mine.parent.mkdir()
    mine.write_text("my training result\n")
    assert checkout.git("check-ignore", "output/result.txt").strip() == "output/result.txt"
    return "output/result.txt"


def test_an_ignored_file_the_update_would_add_is_refused_and_kept(checkout: Checkout) -> None:
    path = _ignored_file_upstream_adds(checkout)
    head = checkout.head()

    done = checkout.manager("update")

    assert done.returncode == errors.DirtyTree.exit_code, done.stderr
    assert path in done.stderr
    assert (checkout.path / path).read_text() == "my training result\n"
    assert checkout.head() == head
    assert checkout.sync_calls() == []
    assert "Traceback" not in done.stderr


def test_force_does_not_overwrite_an_ignored_file_either(checkout: Checkout) -> None:
    path = _ignored_file_upstream_adds(checkout)

    done = checkout.manager("update", "--force")

    assert done.returncode == errors.DirtyTree.exit_code, done.stderr
    assert (checkout.path / path).read_text() == "my training result\n"


def test_a_file_where_upstream_adds_a_folder_is_refused(checkout: Checkout) -> None:
    checkout.push_upstream({"logs/keep/README": "upstream\n"}, "add logs/keep/")
    (checkout.path / "logs").mkdir()
    (checkout.path / "logs" / "keep").write_text("my log\n")  # a file where a folder comes

    done = checkout.manager("update")

    assert done.returncode == errors.DirtyTree.exit_code, done.stderr
    assert "logs/keep" in done.stderr
    assert (checkout.path / "logs" / "keep").read_text() == "my log\n"


def test_dry_run_reports_the_same_collision(checkout: Checkout) -> None:
    path = _ignored_file_upstream_adds(checkout)
    before = checkout.snapshot()

    done = checkout.manager("update", "--dry-run")

    assert done.returncode == errors.DirtyTree.exit_code, done.stderr
    assert path in done.stderr
    assert checkout.snapshot() == before
    assert (checkout.path / path).read_text() == "my training result\n"


def test_auto_with_a_collision_warns_keeps_the_file_and_still_syncs(checkout: Checkout) -> None:
    path = _ignored_file_upstream_adds(checkout)
    head = checkout.head()

    done = checkout.manager("update", "--auto", "--cpu")

    assert done.returncode == 0, done.stderr
    assert "warning" in done.stderr and path in done.stderr
    assert (checkout.path / path).read_text() == "my training result\n"
    assert checkout.head() == head
    assert [(c["mark"], c["args"]) for c in checkout.sync_calls()] == [("v1", ["--cpu"])]


def test_auto_when_git_itself_refuses_warns_and_still_syncs(checkout: Checkout) -> None:
    """A merge in progress with nothing staged: every check of ours passes, then git's
    fast-forward refuses. --auto must still warn and sync, not exit 7."""
    checkout.push_upstream({"notes.txt": "upstream edit\n"}, "edit notes")
    checkout.git("switch", "-q", "-c", "side")
    (checkout.path / "side.txt").write_text("side\n")
    checkout.git("add", "side.txt")
    checkout.git("commit", "-q", "-m", "side")
    checkout.git("switch", "-q", "main")
    checkout.git("merge", "-q", "-s", "ours", "--no-ff", "--no-commit", "side")
    assert (checkout.path / ".git" / "MERGE_HEAD").exists()
    head = checkout.head()

    plain = checkout.manager("update")
    assert plain.returncode == errors.UpdateRefused.exit_code, plain.stderr
    assert checkout.sync_calls() == []

    done = checkout.manager("update", "--auto", "--cpu")

    assert done.returncode == 0, done.stderr
    assert "warning" in done.stderr and "git refused" in done.stderr
    assert checkout.head() == head
    assert [(c["mark"], c["args"]) for c in checkout.sync_calls()] == [("v1", ["--cpu"])]


def test_a_read_only_checkout_is_one_line_for_update_and_tools(checkout: Checkout) -> None:
    """Issue 14: a read-only mount (not chmod: the tests run as root) of the checkout."""
    import json
    import sys

    from tests.manager.read_only import run_read_only

    checkout.push_new_code()
    env = {**checkout.env, "AITK_ROOT": str(checkout.path), "AITK_SKIP_TOOLS": "1"}
    head = checkout.head()
    done = run_read_only([checkout.path], [sys.executable, "-m", "manager", "update"],
                         cwd=checkout.path, env=env)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Read-only file system" in done.stderr
    assert checkout.head() == head

    done = run_read_only([checkout.path], [sys.executable, "-m", "manager", "tools", "--json",
                                           "--provision"], cwd=checkout.path, env=env)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout)["exit_code"] == 1
