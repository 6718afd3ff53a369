"""One writer, interruption and a corrupt state: the next sync always completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.manager.sync.conftest import TORCH, Checkout, _Handler, make_spec


def _sync(checkout: Checkout, *args: str) -> subprocess.CompletedProcess[str]:
    return checkout.manager("sync", "--json", *args)


def _light(checkout: Checkout) -> None:
    checkout.write_spec(make_spec(checkout.world, accelerators=()))


def _wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_second_run_waits_for_the_first_and_names_it(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    _light(checkout)
    first = checkout.start("sync", "--json")
    holder = checkout.root / ".aitk.lock.holder"
    _wait_for(holder.exists)
    second = checkout.start("sync", "--json")
    out1, err1 = first.communicate(timeout=240)
    out2, err2 = second.communicate(timeout=240)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert f"waiting for pid {first.pid}" in err2 and "manager sync --json" in err2
    assert json.loads(out2)["data"]["plan"] == []  # planned after the first finished
    assert not holder.exists()


def test_lock_timeout_and_readers_do_not_wait(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    _light(checkout)
    code = ("import sys, time; from manager import lock; from manager.paths import paths\n"
            "with lock.hold(paths(), 'python3 -m manager update'):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=checkout.root, env=checkout.env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        done = checkout.manager("sync", "--dry-run")  # read-only: never waits
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 30
        env = checkout.env | {"AITK_LOCK_TIMEOUT": "1"}
        done = subprocess.run([sys.executable, "-m", "manager", "sync"], cwd=checkout.root,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 4
        assert f"pid {holder.pid}" in done.stderr and "manager update" in done.stderr
        assert not checkout.venv.exists()  # it did nothing
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_interrupted_mid_install_then_the_next_sync_completes(uv_checkout: Checkout,
                                                              sig: signal.Signals) -> None:
    checkout = uv_checkout
    _light(checkout)
    checkout.env["UV_CACHE_DIR"] = str(checkout.root.parent / "uv-cache")  # a real download
    checkout.requirements("demo-req==1.0", "slowpkg==1.0")
    _Handler.slow.add("slowpkg-1.0-py3-none-any.whl")
    proc = checkout.start("sync")
    seen: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    _wait_for(lambda: any("slowpkg" in line for line in seen)
              or any("requirements of requirements.txt" in line for line in seen))
    time.sleep(1.0)
    os.killpg(proc.pid, sig)  # the manager and its installer, as a terminal would
    code = proc.wait(timeout=60)
    reader.join(timeout=10)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 130), "".join(seen)
    _Handler.slow.discard("slowpkg-1.0-py3-none-any.whl")
    assert checkout.state()["venv_fingerprint"] is None  # nothing claimed as verified

    done = _sync(checkout)
    assert done.returncode == 0, done.stderr
    installed = checkout.installed()
    assert installed["torch"] == TORCH and installed["slowpkg"] == "1.0"
    state = checkout.state()
    assert state["venv_fingerprint"] and state["companions"]["torchvision"]["status"] == "ok"
    assert json.loads(_sync(checkout).stdout)["data"]["plan"] == []


def test_corrupt_state_is_kept_aside_and_reverified(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    _light(checkout)
    assert _sync(checkout).returncode == 0
    checkout.state_file.write_text('{"version": 1, "backend": ')
    done = _sync(checkout)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    backups = list(checkout.venv.glob("aitk_manager_state.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == '{"version": 1, "backend": '
    assert result["data"]["state_backup"] == str(backups[0])
    assert "unusable" in done.stderr and "aitk: aitk:" not in done.stderr
    kinds = [s["kind"] for s in result["data"]["plan"]]
    assert "verify" in kinds and "install-torch" not in kinds  # re-verified, not reinstalled
    assert checkout.state()["torch"]["status"] == "ok"
    assert json.loads(_sync(checkout).stdout)["data"]["plan"] == []


def test_a_state_nested_2000_deep_is_kept_aside_and_reverified(uv_checkout: Checkout) -> None:
    """Issue 14: json raises RecursionError on it; the sync must still set it aside."""
    checkout = uv_checkout
    _light(checkout)
    assert _sync(checkout).returncode == 0
    deep = "[" * 2000 + "]" * 2000
    checkout.state_file.write_text(deep)
    done = _sync(checkout)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    backups = list(checkout.venv.glob("aitk_manager_state.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == deep
    assert json.loads(_sync(checkout).stdout)["data"]["plan"] == []


# ---- issue 14: read-only checkout or .venv ------------------------------------------------


def _one_line_json_failure(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["exit_code"] == 1 and envelope["error"]["message"]
    return envelope


@pytest.mark.parametrize("read_only", ["checkout", "venv"])
def test_a_read_only_checkout_or_venv_is_one_line_with_json(uv_checkout: Checkout,
                                                            read_only: str) -> None:
    from tests.manager.read_only import run_read_only

    checkout = uv_checkout
    _light(checkout)
    assert _sync(checkout).returncode == 0
    folder = checkout.root if read_only == "checkout" else checkout.venv
    argv = [sys.executable, "-m", "manager", "sync", "--json"]
    if read_only == "checkout":
        # A no-op writes nothing, not even the lock: it answers, as `check` does (it
        # used to fail on the lock file).
        noop = run_read_only([folder], argv, cwd=checkout.root, env=checkout.env)
        assert noop.returncode == 0, noop.stderr
        assert json.loads(noop.stdout)["data"]["plan"] == []
    done = run_read_only([folder], [*argv, "--force"], cwd=checkout.root, env=checkout.env)
    envelope = _one_line_json_failure(done)
    assert "Read-only file system" in done.stderr + envelope["error"]["message"]


# ---- issue 14: a sync never swaps packages under a running training job ------------------


def test_sync_refuses_while_a_training_job_runs_unless_forced(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    _light(checkout)
    assert _sync(checkout).returncode == 0
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        runs = checkout.root / ".aitk-run"
        runs.mkdir()
        (runs / f"{job.pid}.json").write_text(json.dumps({"pid": job.pid, "name": "my_lora"}))
        noop = _sync(checkout)  # nothing to change: nothing to refuse
        assert noop.returncode == 0, noop.stderr

        checkout.requirements("demo-req==1.0", "demo-extra==1.0")
        before = checkout.installed()
        done = _sync(checkout)
        assert done.returncode == 7, done.stderr
        envelope = json.loads(done.stdout)
        assert "my_lora" in envelope["error"]["message"]
        assert str(job.pid) in envelope["error"]["message"]
        assert "--force" in envelope["error"]["hint"]
        assert checkout.installed() == before  # nothing was touched

        forced = _sync(checkout, "--force")
        assert forced.returncode == 0, forced.stderr
        assert "warning" in forced.stderr and "my_lora" in forced.stderr
        assert checkout.installed()["demo-extra"] == "1.0"
    finally:
        job.kill()
        job.wait()


# ---- issue 14: --force reinstalls the torch stack, never the libraries it shares ----------


def test_force_reinstalls_the_stack_but_not_its_dependencies(uv_checkout: Checkout) -> None:
    """A companion depends on demo-dep, as torch depends on filelock, which the manager
    itself imports: a concurrent manager run (check, doctor: they never wait for the lock)
    crashed with ModuleNotFoundError while --force reinstalled it. --force now replaces
    the stack's own files only; its dependencies stay as they are."""
    from spec import Wheel
    from tests.manager.sync.conftest import build_wheel

    checkout = uv_checkout
    world = checkout.world
    comp = build_wheel(world.wheels / "issue14", "aitkcomp", "1.0.0+cpu",
                       requires=("demo-dep==1.0",))
    world.index.add("pytorch", comp)
    world.index.add("pytorch", world.wheels / "demo_dep-1.0-py3-none-any.whl")
    checkout.write_spec(make_spec(world, accelerators=(),
                                  companions=(Wheel("aitkcomp", "1.0.0", "cpu", False,
                                                    "aitkcomp"),)))
    assert _sync(checkout).returncode == 0
    site = next((checkout.venv / "lib").glob("python3*/site-packages"))
    dep, companion = site / "demo_dep" / "__init__.py", site / "aitkcomp" / "__init__.py"
    for installed in (dep, companion):  # a mark a reinstall would wash away
        installed.write_text(installed.read_text() + "# untouched\n")

    done = _sync(checkout, "--force")

    assert done.returncode == 0, done.stderr
    assert "# untouched" not in companion.read_text()  # really reinstalled
    assert "# untouched" in dep.read_text()  # the shared dependency was not touched
    assert checkout.installed()["demo-dep"] == "1.0"
