"""`manager shortcut` and the launchers it points at."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manager.commands import shortcut
from tests.external_tools import require_tool
from tests.manager.health.conftest import REPO

# Stands in for the manager: records each call, fails the ones named in AITK_TEST_FAIL.
FAKE_MANAGER = '''
import json, os, signal, sys, time
with open(os.environ["AITK_TEST_CALLS"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()}) + "\\n")
print("manager says: " + " ".join(sys.argv[1:]), flush=True)
if sys.argv[1] == "launch" and os.environ.get("AITK_TEST_WAIT"):
    def stop(signum, frame):
        print("saved at step 7", flush=True)
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    open(os.environ["AITK_TEST_WAIT"], "w").close()
    while True:
        time.sleep(0.05)
fail = os.environ.get("AITK_TEST_FAIL", "")
sys.exit(4 if sys.argv[1] in fail.split(",") else 0)
'''


@pytest.fixture
def spaced_checkout(tmp_path, monkeypatch):
    """A checkout with a space in its path: the launchers and a stand-in manager."""
    root = tmp_path / "my aitk"
    root.mkdir()
    shutil.copytree(REPO / "launchers", root / "launchers")
    (root / "manager").mkdir()
    (root / "manager" / "__init__.py").write_text("")
    (root / "manager" / "__main__.py").write_text(FAKE_MANAGER)
    monkeypatch.setenv("AITK_ROOT", str(root))
    return root


def desktop_entry(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if line and not line.startswith("#"))


def exec_argv(value: str) -> list[str]:
    """Parse an Exec value as the Desktop Entry spec says: undo the string escaping, then
    split on spaces outside double quotes, where a backslash takes the next character."""
    text = re.sub(r"\\(.)", lambda m: {"s": " ", "n": "\n", "t": "\t", "r": "\r"}.get(
        m[1], m[1]), value)
    args, current, quoted, escaped, started = [], [], False, False, False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted, started = not quoted, True
        elif char == " " and not quoted:
            if current or started:
                args.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
    assert not quoted and not escaped, value
    if current or started:
        args.append("".join(current))
    return [a.replace("%%", "%") for a in args]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes the Linux entry")
def test_desktop_file_is_idempotent(spaced_checkout, tmp_path, run_cli):
    desktop = tmp_path / "Desk top"
    code, out, err = run_cli("shortcut", "--desktop-dir", str(desktop), "--json")
    assert code == 0, err
    data = json.loads(out)["data"]
    assert data["action"] == "written"
    written = Path(data["path"])
    assert written.parent == desktop and written.suffix == ".desktop"
    assert os.access(written, os.X_OK)

    entry = desktop_entry(written)
    assert entry["Terminal"] == "true"
    assert entry["Path"] == str(spaced_checkout)
    assert exec_argv(entry["Exec"]) == ["/bin/sh",
                                        str(spaced_checkout / "launchers" / "aitk-launch.sh")]
    before = written.read_bytes()
    code, out, _ = run_cli("shortcut", "--desktop-dir", str(desktop), "--json")
    assert json.loads(out)["data"]["action"] == "unchanged"
    assert written.read_bytes() == before
    assert os.listdir(desktop) == [written.name]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes the Linux entry")
def test_desktop_file_validates(spaced_checkout, tmp_path, run_cli):
    validate = require_tool("desktop-file-validate")
    code, out, err = run_cli("shortcut", "--desktop-dir", str(tmp_path / "Desk top"), "--json")
    assert code == 0, err
    done = subprocess.run([validate, json.loads(out)["data"]["path"]], capture_output=True,
                          text=True)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_remove(spaced_checkout, tmp_path, run_cli):
    desktop = tmp_path / "desk"
    run_cli("shortcut", "--desktop-dir", str(desktop))
    assert len(os.listdir(desktop)) == 1
    code, out, _ = run_cli("shortcut", "--desktop-dir", str(desktop), "--remove", "--json")
    assert code == 0 and json.loads(out)["data"]["action"] == "removed"
    assert os.listdir(desktop) == []
    code, out, _ = run_cli("shortcut", "--desktop-dir", str(desktop), "--remove", "--json")
    assert code == 0 and json.loads(out)["data"]["action"] == "absent"


def test_two_checkouts_get_two_shortcuts(tmp_path):
    names = {shortcut.shortcut_name(tmp_path / n / "aitk", "linux") for n in ("a", "b")}
    assert len(names) == 2
    assert all(n.startswith("aitk-aitk-") and n.endswith(".desktop") for n in names)


def run_entry(written: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = exec_argv(desktop_entry(written)["Exec"])
    return subprocess.run(argv, cwd="/", env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="runs the Linux entry")
@pytest.mark.parametrize("fail, expected", [("", 0), ("launch", 4), ("update", 0)])
def test_the_entry_updates_then_launches(spaced_checkout, tmp_path, run_cli, fail, expected):
    desktop = tmp_path / "desk"
    _, out, _ = run_cli("shortcut", "--desktop-dir", str(desktop), "--json")
    calls = tmp_path / "calls.jsonl"
    env = {**os.environ, "AITK_TEST_CALLS": str(calls), "AITK_TEST_FAIL": fail}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    done = run_entry(Path(json.loads(out)["data"]["path"]), env)
    assert done.returncode == expected, done.stdout + done.stderr
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["argv"] for c in made] == [["update", "--auto"], ["launch"]]
    assert {c["cwd"] for c in made} == {str(spaced_checkout)}
    log = (spaced_checkout / "logs" / "launcher.log").read_text()
    assert "manager says: update --auto" in log and "manager says: launch" in log
    assert "manager says: launch" in done.stdout  # and shown in the window
    if fail:
        assert f"aitk: the log is {spaced_checkout}/logs/launcher.log" in done.stdout
    if fail == "update":
        assert "update failed" in log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="runs the Linux entry")
def test_ctrl_c_in_the_window_keeps_the_log(spaced_checkout, tmp_path, run_cli):
    """A terminal's Ctrl+C reaches every process in the window's group: the launcher
    shell and tee must outlive it, so the trainer's last words reach the log."""
    import signal
    import time

    _, out, _ = run_cli("shortcut", "--desktop-dir", str(tmp_path / "desk"), "--json")
    ready = tmp_path / "ready"
    env = {**os.environ, "AITK_TEST_CALLS": str(tmp_path / "calls.jsonl"),
           "AITK_TEST_WAIT": str(ready)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    argv = exec_argv(desktop_entry(Path(json.loads(out)["data"]["path"]))["Exec"])
    window = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert window.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(window.pid, signal.SIGINT)
    shown, _ = window.communicate(timeout=60)
    assert window.returncode == 130
    assert "saved at step 7" in shown
    log = (spaced_checkout / "logs" / "launcher.log").read_text()
    assert "saved at step 7" in log
    assert "stopped with exit status 130" in log


def test_command_file_for_macos(tmp_path):
    root = tmp_path / "it's here"
    template = (REPO / "launchers" / "macos" / "aitk.command.in").read_text()
    text = shortcut.render_command(template, root)
    line = [x for x in text.splitlines() if x.startswith("exec ")][0]
    assert shlex.split(line) == ["exec", "/bin/sh", str(root / "launchers" / "aitk-launch.sh")]


def test_windows_shortcut_is_made_by_the_script(tmp_path):
    root = Path("C:/Users/Ann Lee/aitk")
    link = Path("C:/Users/Ann Lee/Desktop/aitk.lnk")
    argv = shortcut.windows_argv(root, link)
    assert argv[:6] == ["powershell.exe", "-NoProfile", "-NonInteractive", "-ExecutionPolicy",
                        "Bypass", "-File"]
    assert argv[6] == str(root / "launchers" / "windows" / "create-shortcut.ps1")
    options = dict(zip(argv[7::2], argv[8::2], strict=True))
    assert options == {"-ShortcutPath": str(link),
                       "-Target": str(root / "launchers" / "windows" / "aitk.bat"),
                       "-WorkingDirectory": str(root)}


def test_windows_scripts_content():
    windows = REPO / "launchers" / "windows"
    bat = (windows / "aitk.bat").read_text()
    assert 'cd /d "%~dp0..\\.."' in bat  # the checkout, whatever the current folder
    assert '-File "%~dp0aitk-launch.ps1"' in bat
    assert "pause" in bat and 'if not "%AITK_CODE%"=="0"' in bat  # window stays on failure
    assert "exit /b %AITK_CODE%" in bat
    body = (windows / "aitk-launch.ps1").read_text()
    assert body.index("'update', '--auto'") < body.index("'launch'")
    assert "Tee-Object -FilePath $log -Append" in body
    assert "Join-Path $logs 'launcher.log'" in body
    maker = (windows / "create-shortcut.ps1").read_text()
    for needle in ("WScript.Shell", "CreateShortcut($ShortcutPath)", "$link.TargetPath = $Target",
                   "$link.WorkingDirectory = $WorkingDirectory", "$link.Save()"):
        assert needle in maker


@pytest.mark.parametrize("arg, quoted", [
    ("/bin/sh", "/bin/sh"),
    ("/a b/x.sh", '"/a b/x.sh"'),
    ('/q"uote/$x`y', '"/q\\\\"uote/\\\\$x\\\\`y"'),
    ("/back\\slash", '"/back\\\\\\\\slash"'),
    ("/100%/x", "/100%%/x"),
])
def test_exec_quoting(arg, quoted):
    assert shortcut.desktop_exec_arg(arg) == quoted
    assert exec_argv(quoted) == [arg]


def test_xdg_desktop_dir(tmp_path):
    home = tmp_path / "home"
    dirs = '# comment\nXDG_DESKTOP_DIR="$HOME/Bureau"\nXDG_DOWNLOAD_DIR="$HOME/dl"\n'
    assert shortcut.xdg_desktop({}, home, dirs) == home / "Bureau"
    assert shortcut.xdg_desktop({}, home, None) == home / "Desktop"
    assert shortcut.xdg_desktop({}, home, 'XDG_DESKTOP_DIR="$HOME/"\n') == home / "Desktop"


def test_missing_default_desktop_is_a_usage_error(spaced_checkout, tmp_path, run_cli,
                                                   monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "noconfig"))
    code, _, err = run_cli("shortcut")
    assert code == 2
    assert "--desktop-dir" in err


def test_a_desktop_dir_that_is_a_file_is_one_line_exit_2(spaced_checkout, tmp_path, run_cli):
    afile = tmp_path / "not-a-folder"
    afile.write_text("x")
    code, out, err = run_cli("shortcut", "--desktop-dir", str(afile), "--json")
    assert code == 2
    assert json.loads(out)["error"]["message"] == f"--desktop-dir {afile} is not a folder"
    assert afile.read_text() == "x"


def test_a_desktop_dir_that_cannot_be_made_is_an_error_not_a_traceback(spaced_checkout,
                                                                      tmp_path, run_cli):
    (tmp_path / "afile").write_text("x")
    desk = tmp_path / "afile" / "desk"  # under a file: creating it fails (even as root)
    code, _, err = run_cli("shortcut", "--desktop-dir", str(desk))
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"aitk: error: cannot write {desk}/")
