"""The command-line contract: help lists every verb, usage errors are one line and exit 2,
`--json` prints nothing but the envelope on stdout, refusals exit 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from manager.cli import app

ROOT = Path(__file__).resolve().parents[2]
ENVELOPE_KEYS = {"schema_version", "command", "ok", "exit_code", "data", "messages", "error"}


@pytest.fixture
def no_gpu_env(tmp_path):
    """This machine as a plain Linux box without any GPU tools, whatever it really has."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {"PATH": str(empty), "NO_COLOR": "1", "AITK_HOST_OS": "Linux",
            "AITK_HOST_ARCH": "x86_64", "AITK_HOST_PYTHON": "3.11.7"}


def test_help_lists_every_command(no_gpu_env):
    """The one real `python -m manager` here: the rest run the same CLI in-process."""
    names = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert {"version", "detect", "spec"} <= set(names)
    done = subprocess.run([sys.executable, "-m", "manager", "--help"], cwd=ROOT, env=no_gpu_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for name in names:
        assert name in done.stdout, name


def test_no_arguments_prints_help(manager_cli, no_gpu_env):
    done = manager_cli(env=no_gpu_env)
    assert done.returncode == 0 and "detect" in done.stdout


@pytest.mark.parametrize("argv", [
    ["spec", "--bogus"],
    ["detect", "unexpected-argument"],
    ["no-such-command"],
    ["spec", "--from"],
    ["version", "--json=maybe"],
])
def test_usage_errors_exit_2_with_one_line(manager_cli, argv, no_gpu_env):
    done = manager_cli(*argv, env=no_gpu_env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("aitk: usage error:")


@pytest.mark.parametrize("argv,code", [
    (["version", "--json"], 0),
    (["detect", "--json"], 0),
    (["spec", "--cpu", "--json"], 0),
    (["spec", "--json"], 3),  # refused: no GPU and no --cpu
])
def test_json_prints_only_the_envelope(manager_cli, argv, code, no_gpu_env):
    done = manager_cli(*argv, env=no_gpu_env)
    assert done.returncode == code
    doc = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert set(doc) == ENVELOPE_KEYS
    assert doc["exit_code"] == code and doc["ok"] is (code == 0)
    assert doc["command"] == argv[0]


def test_refusal_is_exit_3_with_message_and_hint(manager_cli, no_gpu_env):
    done = manager_cli("spec", env=no_gpu_env)
    assert done.returncode == 3
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("aitk: error:") and "--cpu" in lines[0]
    assert lines[1].startswith("aitk: hint:")
    doc = json.loads(manager_cli("spec", "--json", env=no_gpu_env).stdout)
    assert doc["error"]["type"] == "UnsupportedMachine" and "--cpu" in doc["error"]["hint"]


def test_human_output_has_no_escape_codes_when_piped(manager_cli, no_gpu_env):
    for argv in (["detect"], ["spec", "--cpu"], ["version"]):
        done = manager_cli(*argv, env=no_gpu_env)
        assert done.returncode == 0
        assert "\x1b[" not in done.stdout + done.stderr


def test_spec_human_table(manager_cli, no_gpu_env):
    done = manager_cli("spec", "--cpu", env=no_gpu_env)
    assert "2.13.0+cpu" in done.stdout and "torchcodec" in done.stdout


@pytest.mark.parametrize("content,why", [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ("[1, 2]", "is not a `detect --json` document"),
    ('{"os": "linux"}', "missing arch, python"),
    ('{"schema_version": 1, "data": {"arch": "x86_64"}}', "missing os, python"),
    ('{"os": "linux", "arch": "x86_64", "python": "3.11", "nvidia": "yes"}', "'nvidia'"),
    ('{"os": "linux", "arch": "x86_64", "python": "3.11", "rocm": {"gpus": [1]}}', "'rocm'"),
])
def test_spec_from_bad_file_is_one_line_exit_2(manager_cli, content, why, tmp_path, no_gpu_env):
    path = tmp_path / "detect.json"
    if content is not None:
        path.write_text(content)
    done = manager_cli("spec", "--from", str(path), env=no_gpu_env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and why in done.stderr, done.stderr
    as_json = manager_cli("spec", "--json", "--from", str(path), env=no_gpu_env)
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["error"]["type"] == "UsageError"


def test_spec_from_a_directory_is_one_line_exit_2(manager_cli, tmp_path, no_gpu_env):
    done = manager_cli("spec", "--from", str(tmp_path), env=no_gpu_env)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1


# ---- every verb ------------------------------------------------------------------------

COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]
# These hand unknown arguments on (to run.py, to pytest): no usage error of their own.
PASS_THROUGH = {"launch", "test"}


def takes_json(name: str) -> bool:
    return any("--json" in getattr(p, "opts", ()) for p in COMMANDS[name].params)


def test_the_verb_list_is_known():
    """A new verb must be added here, and so gets the contract tests below."""
    assert set(COMMANDS) == {"version", "info", "detect", "spec", "install", "sync", "test",
                             "tools", "update", "check", "doctor", "launch", "shortcut"}


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - PASS_THROUGH))
def test_every_verb_rejects_an_unknown_flag_in_one_line(manager_cli, name, no_gpu_env):
    done = manager_cli(name, "--no-such-flag", env=no_gpu_env)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"aitk: usage error: No such option '--no-such-flag'. "
        f"(see `python3 -m manager {name} --help`)"]


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if takes_json(n)))
def test_every_json_verb_answers_a_usage_error_with_an_envelope(manager_cli, name, no_gpu_env):
    done = manager_cli(name, "--json", "--no-such-flag", env=no_gpu_env)
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert set(doc) == ENVELOPE_KEYS
    assert (doc["command"], doc["ok"], doc["exit_code"]) == (name, False, 2)
    assert doc["error"]["type"] == "UsageError" and "--no-such-flag" in doc["error"]["message"]
    assert len(done.stderr.splitlines()) == 1  # people still get the line on stderr


def test_the_json_verbs_are_the_ones_scripts_call():
    assert {n for n in COMMANDS if takes_json(n)} >= {
        "version", "info", "detect", "spec", "sync", "check", "doctor", "tools", "shortcut"}


def test_no_color_on_a_terminal(no_gpu_env):
    """On a tty rich colours doctor's statuses; NO_COLOR turns colour off (bold may stay)."""
    import os
    import pty

    def on_tty(env: dict[str, str]) -> str:
        leader, follower = pty.openpty()
        child = subprocess.Popen([sys.executable, "-m", "manager", "doctor"], cwd=ROOT,
                                 env=env, stdin=follower, stdout=follower, stderr=follower)
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        os.close(leader)
        assert child.wait(timeout=180) in (0, 1)
        return out.decode()

    env = {k: v for k, v in no_gpu_env.items() if k != "NO_COLOR"}
    assert "\x1b[32mOK" in on_tty(env)  # coloured on a terminal...
    plain = on_tty({**env, "NO_COLOR": "1"})
    assert "OK" in plain and "\x1b[3" not in plain  # ...and not with NO_COLOR


def test_version_outside_a_checkout_says_the_commit_is_unknown(manager_cli, no_gpu_env, tmp_path):
    done = manager_cli("version", env={**no_gpu_env, "AITK_ROOT": str(tmp_path)})
    assert done.returncode == 0
    assert "commit   unknown (not a git checkout" in done.stdout and "null" not in done.stdout
    doc = json.loads(manager_cli("version", "--json",
                             env={**no_gpu_env, "AITK_ROOT": str(tmp_path)}).stdout)
    assert doc["data"]["commit"] is None


def test_the_command_table_lists_each_verbs_flags():
    """The command table in docs/manager.md is what people read: every verb, with its
    real flags."""
    import re

    text = (ROOT / "docs" / "manager.md").read_text(encoding="utf-8")
    table = text.split("| Command | What it does |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z]+)((?: [^`]*)?)` \|", table, re.M))
    assert set(rows) == set(COMMANDS)
    for name, command in COMMANDS.items():
        documented = set(re.findall(r"--[\w-]+", rows[name]))
        real = {o for p in command.params for o in getattr(p, "opts", ())
                if o.startswith("--") and o != "--help"}
        assert documented == real, name


@pytest.mark.parametrize("value, plain", [("1", True), ("", False), (None, False)])
def test_no_color_follows_the_convention(value, plain, monkeypatch):
    from manager.output import stderr_console, stdout_console

    monkeypatch.delenv("NO_COLOR", raising=False)
    if value is not None:
        monkeypatch.setenv("NO_COLOR", value)
    assert stdout_console().no_color is plain and stderr_console().no_color is plain


@pytest.mark.parametrize("argv", [["spec", "--json", "--from"],
                                  ["shortcut", "--json", "--desktop-dir"]])
def test_an_option_missing_its_value_is_a_usage_error_of_that_verb(manager_cli, argv, no_gpu_env):
    done = manager_cli(*argv, env=no_gpu_env)
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["command"] == argv[0] and doc["error"]["type"] == "UsageError"
    assert done.stderr.splitlines() == [
        f"aitk: usage error: Option '{argv[-1]}' requires an argument. "
        f"(see `python3 -m manager {argv[0]} --help`)"]
