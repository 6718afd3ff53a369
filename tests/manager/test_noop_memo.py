"""manager/noop_memo.py: which command lines it answers, what its key covers (each
input of the plan changes it; what a shell varies between two runs does not), and the
record/answer round trip. tests/manager/sync/test_engine.py runs it through the real
bootstrap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from manager import noop_memo


@pytest.mark.parametrize("argv, flags", [
    (["sync"], ()), (["sync", "--json", "--cpu"], ("--cpu", "--json")),
    (["sync", "--force"], None), (["check"], None), ([], None),
    (["sync", "--dry-run", "--dry-run"], ("--dry-run",))])
def test_only_a_plain_sync_is_answered(argv, flags):
    assert noop_memo.flags_of(argv) == flags
    assert (noop_memo.key(Path("."), argv) is None) == (flags is None)


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "aitk checkout"
    for name in ("spec.py", "requirements.txt", "manager/commands/sync.py",
                 "manager/migrations/001_x.py", "ui/src/main.js", ".venv/pyvenv.cfg",
                 ".venv/aitk_manager_state.json"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / ".venv/lib/python3.11/site-packages/demo-1.0.dist-info").mkdir(parents=True)
    monkeypatch.delenv(noop_memo.ENV_KEY, raising=False)
    return root


def _bump(path: Path) -> None:
    path.write_text(path.read_text() + "\n")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.mark.parametrize("change", [
    lambda root: _bump(root / "requirements.txt"),
    lambda root: _bump(root / "spec.py"),
    lambda root: _bump(root / ".venv/aitk_manager_state.json"),
    lambda root: _bump(root / "manager/commands/sync.py"),
    lambda root: (root / "manager/migrations/002_y.py").write_text("new"),
    lambda root: (root / ".venv/lib/python3.11/site-packages/other-2.0.dist-info").mkdir(),
    lambda root: (root / ".venv.old").mkdir(),  # a swap to recover
    lambda root: _bump(root / "ui/src/main.js"),
    lambda root: os.environ.__setitem__("AITK_TORCH_INDEX_URL", "http://127.0.0.1:1/"),
], ids=["requirements", "spec", "state", "manager code", "a migration", "a package",
        "a swap leftover", "the web UI", "a variable"])
def test_each_input_of_the_plan_changes_the_key(checkout: Path, change, monkeypatch):
    monkeypatch.delenv("AITK_TORCH_INDEX_URL", raising=False)
    before = noop_memo.key(checkout, ["sync"])
    change(checkout)
    assert noop_memo.key(checkout, ["sync"]) != before


def test_what_a_shell_varies_and_the_memo_itself_do_not(checkout: Path, monkeypatch):
    before = noop_memo.key(checkout, ["sync"])
    monkeypatch.setenv("PWD", "/somewhere/else")
    monkeypatch.setenv("SHLVL", "7")
    (checkout / ".venv" / noop_memo.MEMO_NAME).write_text("{}")
    assert noop_memo.key(checkout, ["sync"]) == before


def test_a_detection_tool_appearing_on_path_changes_the_key(checkout: Path, tmp_path,
                                                            monkeypatch):
    before = noop_memo.key(checkout, ["sync"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with_path = noop_memo.key(checkout, ["sync"])
    assert with_path != before
    _bump(smi)  # a driver update rewrites it
    assert noop_memo.key(checkout, ["sync"]) != with_path


def test_recorded_then_answered_under_the_same_key_only(checkout: Path, capsys,
                                                        monkeypatch):
    assert noop_memo.answer(checkout, ["sync"]) is None  # no memo yet
    assert os.environ[noop_memo.ENV_KEY] == noop_memo.key(checkout, ["sync"])
    noop_memo.record(checkout, "Nothing to do\n", 0)
    capsys.readouterr()
    assert noop_memo.answer(checkout, ["sync"]) == 0
    assert capsys.readouterr().out == "Nothing to do\n"
    assert noop_memo.answer(checkout, ["sync", "--json"]) is None  # another key
    _bump(checkout / "requirements.txt")
    assert noop_memo.answer(checkout, ["sync"]) is None
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("memo", [
    "not json", "[1]",
    '{{"version": {v}, "key": "{k}", "stdout": 3, "exit_code": 0}}',
    '{{"version": {v}, "key": "{k}", "stdout": "x", "exit_code": "0"}}',
    '{{"version": 0, "key": "{k}", "stdout": "x", "exit_code": 0}}'])
def test_a_damaged_memo_is_no_answer(checkout: Path, memo: str, capsys):
    """Under the right key, too: a wrong type or an older version is not replayed."""
    text = memo.format(v=noop_memo.VERSION, k=noop_memo.key(checkout, ["sync"]))
    (checkout / ".venv" / noop_memo.MEMO_NAME).write_text(text)
    assert noop_memo.answer(checkout, ["sync"]) is None
    assert capsys.readouterr().out == ""


def test_nothing_is_recorded_without_the_bootstraps_key(checkout: Path):
    noop_memo.record(checkout, "Nothing to do\n", 0)
    assert not (checkout / ".venv" / noop_memo.MEMO_NAME).exists()


def test_the_managers_overrides_are_never_answered(checkout: Path, monkeypatch):
    for name in ("AITK_ROOT", "AITK_SPEC_FILE", "AITK_HOST_OS", "AITK_NO_BOOTSTRAP"):
        with monkeypatch.context() as m:
            m.setenv(name, "x")
            assert noop_memo.key(checkout, ["sync"]) is None
