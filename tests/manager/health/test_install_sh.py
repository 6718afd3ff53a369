"""install.sh: shellcheck, and runs against a stand-in manager in a path with a space."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from manager.commands import shortcut
from tests.external_tools import require_tool
from tests.manager.health.conftest import REPO, base_python

FAKE_MANAGER = '''
import json, os, sys
with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                         "python": sys.executable}) + "\\n")
'''


@pytest.mark.parametrize("script", ["install.sh", "launchers/aitk-launch.sh",
                                    "launchers/python.sh"])
def test_shellcheck_clean(script):
    shellcheck = require_tool("shellcheck")
    done = subprocess.run([shellcheck, "-x", "--shell=sh", script], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rendered_command_file_is_shellcheck_clean(tmp_path):
    shellcheck = require_tool("shellcheck")
    template = (REPO / "launchers" / "macos" / "aitk.command.in").read_text()
    rendered = tmp_path / "aitk.command"
    rendered.write_text(shortcut.render_command(template, tmp_path / "it's mine"))
    done = subprocess.run([shellcheck, str(rendered)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.fixture
def checkout(tmp_path):
    """install.sh and its helper next to a stand-in manager, in a path with a space."""
    root = tmp_path / "my checkout"
    (root / "launchers").mkdir(parents=True)
    shutil.copy2(REPO / "install.sh", root / "install.sh")
    shutil.copy2(REPO / "launchers" / "python.sh", root / "launchers" / "python.sh")
    (root / "manager").mkdir()
    (root / "manager" / "__init__.py").write_text("")
    (root / "manager" / "__main__.py").write_text(FAKE_MANAGER)
    return root


@pytest.fixture
def bare_path(tmp_path):
    """A PATH with the few tools install.sh needs but no Python and no uv."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("dirname",):
        (tools / name).symlink_to(shutil.which(name))
    return tools


def calls(root: Path) -> list[dict]:
    path = root / "manager" / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run_install(root: Path, *args: str, path: str | None = None, cwd: Path | None = None):
    env = {**os.environ, "PATH": path if path is not None else os.environ["PATH"]}
    return subprocess.run(["/bin/sh", str(root / "install.sh"), *args], cwd=cwd or root.parent,
                          env=env, capture_output=True, text=True, timeout=120)


def test_from_another_folder_with_a_space_and_rerun(checkout, tmp_path):
    elsewhere = tmp_path / "somewhere else"
    elsewhere.mkdir()
    for _ in range(2):  # running it again is fine
        done = run_install(checkout, "--cpu", "--no-launch", cwd=elsewhere)
        assert done.returncode == 0, done.stderr
    made = calls(checkout)
    assert [c["argv"] for c in made] == [["install", "--cpu", "--no-launch"]] * 2
    assert {c["cwd"] for c in made} == {str(checkout)}


def test_arguments_pass_through_verbatim(checkout):
    done = run_install(checkout, "--cpu", "two words", "")
    assert done.returncode == 0, done.stderr
    assert calls(checkout)[0]["argv"] == ["install", "--cpu", "two words", ""]


def test_the_managers_exit_code_is_install_shs(checkout):
    (checkout / "manager" / "__main__.py").write_text("import sys; sys.exit(3)\n")
    assert run_install(checkout).returncode == 3


def fake(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_skips_an_old_python3_for_a_new_python(checkout, bare_path, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "python3", "exit 1\n")  # fails the version check, like Python 3.8 would
    (bin_dir / "python").symlink_to(base_python())
    done = run_install(checkout, "--cpu", path=f"{bin_dir}{os.pathsep}{bare_path}")
    assert done.returncode == 0, done.stderr
    assert calls(checkout)[0]["python"] == str(bin_dir / "python")


def test_no_python_and_no_uv_explains_what_to_install(checkout, bare_path):
    done = run_install(checkout, path=str(bare_path))
    assert done.returncode == 1
    assert "Python 3.10 or newer is needed" in done.stderr
    assert "apt install python3" in done.stderr
    assert calls(checkout) == []


def test_provisions_python_with_uv_into_the_checkout(checkout, bare_path, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "uv.log"
    # A stand-in uv: `uv python install 3.12` puts a Python under $UV_PYTHON_INSTALL_DIR.
    fake(bin_dir, "uv", f'''echo "$*" >> "{log}"
[ "$1 $2" = "python install" ] || exit 2
{shutil.which("mkdir")} -p "$UV_PYTHON_INSTALL_DIR/cpython-3.12-test/bin"
{shutil.which("ln")} -sf "{base_python()}" "$UV_PYTHON_INSTALL_DIR/cpython-3.12-test/bin/python3"
''')
    path = f"{bin_dir}{os.pathsep}{bare_path}"
    for _ in range(2):
        done = run_install(checkout, "--cpu", path=path)
        assert done.returncode == 0, done.stderr
    provisioned = checkout / ".uv" / "python" / "cpython-3.12-test" / "bin" / "python3"
    assert [c["python"] for c in calls(checkout)] == [str(provisioned)] * 2
    assert log.read_text().splitlines() == ["python install 3.12"]  # once: reused after


def test_a_junk_pythonhome_is_named_and_cleared(checkout, bare_path, tmp_path):
    """PYTHONHOME pointing at no Python home stops every interpreter from starting: it
    used to read as "no Python found" (issue 21). The manager drops it for its children
    anyway; install.sh names it and clears it."""
    (checkout / "manager" / "__main__.py").write_text(
        FAKE_MANAGER + 'open(os.path.join(os.path.dirname(__file__), "home.txt"), "w")'
        '.write(os.environ.get("PYTHONHOME", "unset"))\n')
    junk = str(tmp_path / "no python home here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(base_python())  # and no uv to provision one with
    env = {**os.environ, "PYTHONHOME": junk, "PATH": f"{bin_dir}{os.pathsep}{bare_path}"}
    done = subprocess.run(["/bin/sh", str(checkout / "install.sh"), "--cpu"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "PYTHONHOME" in done.stderr and junk in done.stderr
    assert "none was found" not in done.stderr
    assert calls(checkout)[0]["argv"] == ["install", "--cpu"]
    assert (checkout / "manager" / "home.txt").read_text() == "unset"
