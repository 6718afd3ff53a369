"""Issue 14: any unexpected error reaching the CLI boundary is one line on the terminal,
the whole traceback in a log file under logs/ (named in the line), `--json` still prints
its envelope, exit 1."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from manager.cli import main


def _boom(exc: BaseException):
    def run(*_args, **_kwargs):
        raise exc
    return run


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AITK_ROOT", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("exc", [
    RecursionError("maximum recursion depth exceeded"),
    KeyError("surprise"),
    OSError(errno.EROFS, "Read-only file system", "/somewhere/.venv/x"),
], ids=["recursion", "bug", "oserror"])
def test_unexpected_errors_are_one_line_and_a_log(root, monkeypatch, capsys, exc) -> None:
    from manager.commands import version

    monkeypatch.setattr(version, "run", _boom(exc))
    code = main(["version", "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    envelope = json.loads(out)
    assert envelope["exit_code"] == 1 and envelope["ok"] is False
    assert envelope["command"] == "version" and envelope["error"]["message"]
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) <= 2, err  # the error, then its hint
    logs = list((root / "logs").glob("manager-error-*.log"))
    assert len(logs) == 1 and str(logs[0]) in lines[0]
    assert "Traceback" in logs[0].read_text() and type(exc).__name__ in logs[0].read_text()
    if isinstance(exc, OSError):
        assert "Read-only file system" in lines[0] and "/somewhere/.venv/x" in lines[0]

    assert main(["version"]) == 1  # without --json: the same line, nothing on stdout
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err


def test_the_log_goes_to_the_temp_folder_when_logs_cannot_be_written(root, monkeypatch,
                                                                      capsys) -> None:
    from manager.commands import version

    (root / "logs").write_text("a file where the folder belongs")
    monkeypatch.setattr(version, "run", _boom(RuntimeError("x")))
    assert main(["version"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[0]
    logged = Path(line.rsplit("details in ", 1)[1].rstrip(")"))
    assert logged.exists() and "RuntimeError" in logged.read_text()
    logged.unlink()


def test_an_error_outside_a_command_body_is_one_line_too(root, monkeypatch, capsys) -> None:
    """`test` runs outside _finish: its unexpected errors reach main()."""
    from manager.commands import test as test_cmd

    monkeypatch.setattr(test_cmd, "run", _boom(RecursionError("deep")))
    assert main(["test"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RecursionError" in err
