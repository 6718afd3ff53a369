"""manager/__main__.py: the stdlib bootstrap, from a Python with no packages at all."""

from __future__ import annotations

import glob
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from manager import __main__ as bootstrap
from manager import __version__
from tests.manager.manager_copy import copy_manager

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version,ok", [((3, 9, 18), False), ((3, 6, 15), False),
                                        ((3, 10, 0), True), ((3, 14, 2), True)])
def test_python_version_check(version, ok):
    message = bootstrap.python_too_old(version)
    if ok:
        assert message is None
    else:
        assert message == ("aitk: Python 3.10 or newer is required (this is "
                           + ".".join(map(str, version)) + ")")


def _old_pythons() -> list[str]:
    found = {shutil.which(f"python3.{minor}") for minor in range(6, 10)}
    found |= set(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[6-9].*/bin/python3")))
    found |= set(glob.glob(os.path.expanduser("~/.pyenv/versions/2.7.*/bin/python")))
    return sorted(p for p in found if p and "/shims/" not in p)  # pyenv shims may not run


@pytest.mark.parametrize("python", _old_pythons() or [None])
def test_old_python_gets_one_line_naming_the_version(python):
    """A real Python 2.7 or 3.6-3.9 when the machine has one (pyenv, distro packages)."""
    if python is None:
        pytest.skip("no Python older than 3.10 on this machine; the unit test above covers it")
    done = subprocess.run([python, "-m", "manager", "version"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Python 3.10 or newer is required" in lines[0]


def _site_packages(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.glob("lib/python3*/site-packages/*"))


@pytest.mark.slow
def test_bootstrap_from_bare_python(tmp_path):
    """Copy the manager into a fresh folder and run it with a Python that has no packages:
    it must build .venv, run the command, and on the second run not reinstall."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    copy_manager(checkout)
    bare = tmp_path / "bare"  # a venv without even pip: nothing importable but the stdlib
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(NO_COLOR="1", PATH=f"{bare / 'bin'}:/usr/bin:/bin")

    def manager(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, "-m", "manager", *args], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=900)

    first = manager("version")
    assert first.returncode == 0, first.stderr
    assert "0.1.0" in first.stdout
    assert "installing the manager's dependencies" in first.stderr
    # The installer's own output is in the log, the terminal keeps one line per step.
    assert "typer" in (checkout / "logs" / "bootstrap.log").read_text().lower()
    assert "typer" not in first.stderr.lower()
    assert len(first.stderr.splitlines()) <= 2, first.stderr
    marker = checkout / ".venv" / "aitk_bootstrap.txt"
    assert marker.exists()
    installed = _site_packages(checkout / ".venv")
    assert any(name.startswith("typer") for name in installed)
    stamp = marker.stat().st_mtime_ns

    second = manager("version", "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["data"]["version"] == "0.1.0"
    assert "installing" not in second.stderr and "creating" not in second.stderr
    assert marker.stat().st_mtime_ns == stamp
    assert _site_packages(checkout / ".venv") == installed

    # The "done when": detect and the CPU spec work from the bare Python.
    found = manager("detect", "--json")
    assert found.returncode == 0 and json.loads(found.stdout)["command"] == "detect"
    cpu = manager("spec", "--cpu", "--json")
    assert cpu.returncode == 0, cpu.stderr
    assert json.loads(cpu.stdout)["data"]["torch"]["local"] in ("cpu", "cu130", "cu126",
                                                                "rocm7.1", None)


@pytest.mark.parametrize("python", [sys.executable, sys._base_executable],
                         ids=["venv", "bare-reexec"])
def test_the_package_folder_runs_as_a_script_from_any_folder(python, tmp_path):
    """`python3 /path/to/checkout/manager COMMAND` from elsewhere: the checkout, not the
    package folder, goes on sys.path (manager/venv.py must not shadow the stdlib's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run([python, str(ROOT / "manager"), "version", "--json"], cwd=tmp_path,
                          env={**env, "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"]["version"] == __version__


def test_ctrl_c_while_setting_up_is_one_line_and_130(monkeypatch, capsys):
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bootstrap, "inside_venv", lambda: False)
    monkeypatch.setattr(bootstrap, "bootstrapped", lambda: False)
    monkeypatch.setattr(bootstrap, "create_venv", interrupted)
    monkeypatch.delenv("AITK_NO_BOOTSTRAP", raising=False)
    assert bootstrap.main() == 130
    err = capsys.readouterr().err
    assert err == "aitk: interrupted; run the command again to finish setting up\n"


# ---- issue 14: the first .venv build is resumable (built aside, published by rename) -------


def _bare_checkout(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    copy_manager(checkout)
    bare = tmp_path / "bare"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "AITK_NO_BOOTSTRAP")}
    env.update(NO_COLOR="1", PATH=f"{bare / 'bin'}:/usr/bin:/bin")  # no uv: venv + pip
    return checkout, str(bare / "bin" / "python"), env


def _works(checkout: Path, python: str, env: dict[str, str]) -> None:
    done = subprocess.run([python, "-m", "manager", "version", "--json"], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["command"] == "version"
    venv_python = checkout / ".venv" / "bin" / "python"
    pip = subprocess.run([str(venv_python), "-m", "pip", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert pip.returncode == 0, pip.stderr  # the published venv is complete
    assert str(checkout / ".venv") in pip.stdout  # and knows where it lives
    assert sorted(p.name for p in checkout.iterdir() if p.name.startswith(".venv")) == [".venv"]


@pytest.mark.slow
def test_a_venv_left_without_pip_by_a_killed_first_build_is_rebuilt(tmp_path):
    """What kill -9 during `python -m venv` (its ensurepip step) leaves: a .venv with a
    Python, no pip and no marker. Every run used to fail on it until it was deleted."""
    checkout, python, env = _bare_checkout(tmp_path)
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip",
                    str(checkout / ".venv")], check=True)
    _works(checkout, python, env)


class _Stall(http.server.BaseHTTPRequestHandler):
    """An index that never answers: the first request marks the known point."""

    arrived = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802
        type(self).arrived.set()
        type(self).release.wait(120)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_kill_9_during_the_first_build_then_the_next_run_completes(tmp_path):
    checkout, python, env = _bare_checkout(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stall)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stalled = {**env, "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_address[1]}/simple/",
               "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_NO_CACHE_DIR": "1"}
    first = subprocess.Popen([python, "-m", "manager", "version"], cwd=checkout, env=stalled,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        # The venv is made and pip is installing the manager's dependencies right now.
        assert _Stall.arrived.wait(300), "the bootstrap never asked the index"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    finally:
        _Stall.release.set()
        server.shutdown()
    assert not (checkout / ".venv").exists()  # nothing half-built was published

    _works(checkout, python, env)


def test_a_swap_killed_between_its_renames_is_restored_not_rebuilt(tmp_path):
    """A sync rebuilding .venv renames it to .venv.old, then the new one into place; killed
    in between, the next command went through the bootstrap, which built a new .venv from
    the index and let the sync delete the good .venv.old (issue 21). It is put back.
    The restored venv runs the real CLI, so this needs the manager's own packages in the
    test environment (not there in the stdlib-only runs on the other Pythons)."""
    pytest.importorskip("typer")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    copy_manager(checkout)
    venv = checkout / ".venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The manager's dependencies come from the test environment, as if installed there.
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "test-deps.pth").write_text("\n".join(p for p in sys.path if p.endswith(
        "site-packages")) + "\n")
    (venv / "aitk_bootstrap.txt").write_text(bootstrap.requirements_hash() + "\n")
    (venv / "kept.txt").write_text("the verified venv\n")
    os.replace(venv, checkout / ".venv.old")
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "AITK_NO_BOOTSTRAP")}
    # A rebuild could not reach an index: it fails at once instead of downloading.
    env.update(NO_COLOR="1", PATH="/usr/bin:/bin", PIP_CONFIG_FILE=os.devnull,
               PIP_NO_INDEX="1", PIP_FIND_LINKS="")
    done = subprocess.run([sys._base_executable, "-m", "manager", "version", "--json"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "restored .venv from an interrupted rebuild" in done.stderr
    assert "creating" not in done.stderr
    assert (venv / "kept.txt").read_text() == "the verified venv\n"
    assert not (checkout / ".venv.old").exists()


def test_a_noop_sync_is_answered_by_the_bootstrap_until_an_input_changes(tmp_path):
    """manager/noop_memo.py through the real bootstrap: the venv's side records its
    no-op answer under the key the bootstrap handed it (a stand-in venv python here,
    which logs each start); the next plain `sync` with the same flags is printed by the
    bootstrap without starting it; a changed requirement file starts it again."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    copy_manager(checkout)
    (checkout / "requirements.txt").write_text("demo==1.0\n")
    venv = checkout / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "aitk_bootstrap.txt").write_text(bootstrap.requirements_hash() + "\n")
    starts = tmp_path / "starts.log"
    stand_in = venv / "bin" / "python"
    stand_in.write_text(
        "#!/bin/sh\n"
        'echo started >> "$STARTS"\n'
        'printf \'{"version": 1, "key": "%s", "exit_code": 0, "stdout": "Nothing to do\\\\n"}\''
        ' "$AITK_NOOP_KEY" > "$MEMO"\n'
        "echo Nothing to do\n")
    stand_in.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITK_")
           and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(STARTS=str(starts), MEMO=str(venv / "aitk_noop_memo.json"))

    def sync(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys._base_executable, "-m", "manager", "sync", *flags],
                              cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=120)

    def started() -> int:
        return len(starts.read_text().splitlines()) if starts.exists() else 0

    assert sync().stdout == "Nothing to do\n" and started() == 1  # recorded
    for _ in range(2):
        done = sync()
        assert (done.returncode, done.stdout) == (0, "Nothing to do\n"), done.stderr
    assert started() == 1  # answered by the bootstrap alone
    sync("--json")
    assert started() == 2  # other flags: another key
    (checkout / "requirements.txt").write_text("demo==2.0\n")
    sync()
    assert started() == 3
    sync("--force")
    assert started() == 4  # not a plain sync: never answered
