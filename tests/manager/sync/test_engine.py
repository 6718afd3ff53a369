"""The real sync through uv and through pip against the loopback index."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manager import archive
from manager.tools.lifecycle import current_platform
from manager.tools.pins import FFMPEG_SHARED
from spec import Optional_
from tests.manager.sync.conftest import TORCH, Checkout, git_requirement, make_spec


def sync_ok(checkout: Checkout, *args: str) -> dict:
    done = checkout.manager("sync", "--json", *args)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def _compiled(checkout: Checkout, module: str) -> bool:
    site = next((checkout.venv / "lib").glob("python3*/site-packages"))
    return any((site / module / "__pycache__").glob("__init__.*.pyc"))


def test_fresh_install_then_noop(checkout: Checkout) -> None:
    done = checkout.manager("sync", "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    env = json.loads(done.stdout)
    installed = checkout.installed()
    assert installed["torch"] == TORCH
    assert installed["torchvision"] == "0.28.0+cpu"
    assert "torchaudio" not in installed  # never imports: removed and recorded
    assert installed["demo-req"] == "1.0"
    assert installed["accel-good"] == "1.0"
    assert "accel-broken" not in installed and "accel-broken-dep" not in installed
    state = checkout.state()
    assert state["installer"] == env["data"]["installer"]
    assert state["torch"]["status"] == "ok"
    assert state["companions"]["torchvision"]["status"] == "ok"
    assert state["companions"]["torchaudio"]["status"] == "removed"
    statuses = {k: v["status"] for k, v in state["optional"].items()}
    assert statuses == {"accel-good": "ok", "accel-broken": "rolled_back",
                        "accel-uninstallable": "install_failed", "accel-nowheel": "unavailable"}
    broken = state["optional"]["accel-broken"]["detail"]
    assert broken == "ImportError: no kernel image for this GPU"  # one line
    assert "rebuild it for sm_120" in Path(env["data"]["log"]).read_text()  # the rest
    assert state["git_pins"] == {"gitpkg": checkout.world.git_revs[0]}
    assert checkout.run_python("import gitpkg; print(gitpkg.VALUE)").stdout.strip() == "1"
    # Every install pass leaves bytecode (the rig's PYTHONDONTWRITEBYTECODE=1 keeps the
    # imports above from writing any): where .pyc files cannot be written later (a
    # read-only install, the tests' own subprocesses) nothing is compiled at each start.
    for module in ("torch", "torchvision", "demo_req", "gitpkg", "accel_good"):
        assert _compiled(checkout, module), f"{module} has no bytecode"

    (checkout.root / "imports.log").unlink()
    again = sync_ok(checkout)
    assert again["data"]["plan"] == [] and again["data"]["changes"] == []
    assert checkout.state() == state
    assert not (checkout.root / "imports.log").exists()  # a no-op never imports torch
    assert not (checkout.root / "pip-target").exists()  # PIP_TARGET was dropped


def test_requirement_edits_resync(checkout: Checkout) -> None:
    """A new requirement is installed; a moved git pin is reinstalled even though its
    version number did not change (pip would call it satisfied)."""
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    sync_ok(checkout)
    checkout.requirements("demo-req==1.0", "demo-extra==1.0", git_requirement(checkout.world, 1))
    plan = sync_ok(checkout, "--dry-run")["data"]["plan"]
    assert [s["kind"] for s in plan] == ["install-requirements", "reinstall-git-pin", "verify"]
    assert "requirements.txt changed" in plan[0]["description"]
    result = sync_ok(checkout)["data"]
    moved = {c["name"]: (c["before"], c["after"]) for c in result["package_changes"]}
    assert moved == {"demo-extra": (None, "1.0")}  # the torch stack was not touched
    assert checkout.run_python("import gitpkg; print(gitpkg.VALUE)").stdout.strip() == "2"
    assert checkout.state()["git_pins"] == {"gitpkg": checkout.world.git_revs[1]}
    assert sync_ok(checkout)["data"]["plan"] == []


def test_rollback_restores_what_the_accelerator_upgraded(checkout: Checkout) -> None:
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=(
        Optional_("accel-bumps", "accel-bumps==1.0", "accel_bumps"),)))
    checkout.requirements("demo-dep==1.0")
    result = sync_ok(checkout)["data"]
    installed = checkout.installed()
    assert "accel-bumps" not in installed
    assert installed["demo-dep"] == "1.0"  # upgraded to 2.0 by the accelerator, put back
    assert "restored demo-dep==1.0 after rolling back accel-bumps" in result["changes"]
    assert checkout.state()["optional"]["accel-bumps"]["status"] == "rolled_back"
    assert sync_ok(checkout)["data"]["plan"] == []


def test_a_failed_accelerator_left_by_a_killed_run_is_still_rolled_back(
        uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    spec = make_spec(checkout.world, companions=(), accelerators=(
        Optional_("accel-broken", "accel-broken==1.0", "accel_broken"),))
    checkout.write_spec(spec)
    sync_ok(checkout)
    assert "accel-broken" not in checkout.installed()
    # What a kill -9 between the accelerator's install and its rollback leaves: the
    # package in the venv, no outcome recorded, the state unverified.
    pip = subprocess.run([str(checkout.python), "-m", "pip", "install", "-q",
                          "accel-broken==1.0"], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in checkout.env.items()
                              if k not in {"PIP_TARGET", "PIP_USER"}})
    assert pip.returncode == 0, pip.stderr
    state = checkout.state()
    state["optional"].pop("accel-broken")
    state["venv_fingerprint"] = None
    checkout.state_file.write_text(json.dumps(state))

    sync_ok(checkout)
    assert "accel-broken" not in checkout.installed()
    assert checkout.state()["optional"]["accel-broken"]["status"] == "rolled_back"


def _mapped_library(prefix: str) -> str | None:
    """A real shared library this process has mapped, to stand in for FFmpeg's."""
    import ctypes  # noqa: F401  (maps libffi)

    with open("/proc/self/maps") as maps:
        found = sorted({ln.split()[-1] for ln in maps if "/" in ln})
    return next((f for f in found if Path(f).name.startswith(prefix)), None)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_optional_package_is_import_tested_with_the_local_tools(uv_checkout: Checkout
                                                                 ) -> None:
    """torchcodec needs FFmpeg's libraries: its import test must see a local .ffmpeg/."""
    checkout = uv_checkout
    lib = _mapped_library("libffi.so")
    art = FFMPEG_SHARED.artefact(current_platform())
    if lib is None or art is None or shutil.which("ffmpeg"):
        pytest.skip("needs a library to copy, an FFmpeg pin here, and no system ffmpeg")
    _fake_local_ffmpeg(checkout, lib)
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=(
        Optional_("accel-needs-lib", "accel-needs-lib==1.0", "accel_needs_lib"),)))
    sync_ok(checkout)
    assert checkout.state()["optional"]["accel-needs-lib"]["status"] == "ok"
    assert checkout.installed()["accel-needs-lib"] == "1.0"


def _fake_local_ffmpeg(checkout: Checkout, lib: str) -> None:
    """A .ffmpeg/ the manager trusts: a program that answers -version, the library."""
    art = FFMPEG_SHARED.artefact(current_platform())
    assert art is not None
    ffmpeg = checkout.root / ".ffmpeg"
    (ffmpeg / "bin").mkdir(parents=True)
    (ffmpeg / "bin" / "ffmpeg").write_text("#!/bin/sh\necho 'ffmpeg version n7.1'\n")
    (ffmpeg / "bin" / "ffmpeg").chmod(0o755)
    (ffmpeg / "lib").mkdir()
    shutil.copy2(lib, ffmpeg / "lib" / "libaitkprobe.so")
    archive.write_marker(ffmpeg, archive.Marker("ffmpeg", FFMPEG_SHARED.version, art.filename,
                                                "http://mirror", art.sha256 or "ab" * 32,
                                                art.sha256 is not None))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_package_needing_ffmpeg_is_skipped_without_it_and_tried_once_it_is_there(
        uv_checkout: Checkout) -> None:
    """torchcodec needs FFmpeg: without it, no install-then-rollback (and no traceback);
    the skip is recorded with its reason, and the sync after FFmpeg arrives installs it."""
    checkout = uv_checkout
    lib = _mapped_library("libffi.so")
    if lib is None or FFMPEG_SHARED.artefact(current_platform()) is None or shutil.which("ffmpeg"):
        pytest.skip("needs a library to copy, an FFmpeg pin here, and no system ffmpeg")
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=(
        Optional_("accel-needs-lib", "accel-needs-lib==1.0", "accel_needs_lib",
                  needs=("ffmpeg",)),)))
    done = checkout.manager("sync")
    assert done.returncode == 0, done.stderr + done.stdout
    record = checkout.state()["optional"]["accel-needs-lib"]
    assert record["status"] == "skipped" and "needs ffmpeg" in record["detail"]
    assert "shared libraries" in record["detail"]  # the static program would not do
    assert "accel-needs-lib" not in checkout.installed()
    (log,) = sorted((checkout.root / "logs").glob("sync-*.log"))
    assert "accel-needs-lib==1.0" not in log.read_text()  # never installed to fail
    skipped = [ln for ln in done.stdout.splitlines() if ln.startswith("warning: accel-needs")]
    assert len(skipped) == 1 and "needs ffmpeg" in skipped[0] and "next" in skipped[0]
    assert sync_ok(checkout)["data"]["plan"] == []  # nothing new: not tried again

    _fake_local_ffmpeg(checkout, lib)
    again = sync_ok(checkout)
    assert [s["kind"] for s in again["data"]["plan"]][:1] == ["try-optional"]
    assert checkout.state()["optional"]["accel-needs-lib"]["status"] == "ok"


HEAVY = ("httpx", "rich", "typer", "click")
_NOOP_PROBE = """\
import json, sys
from manager.__main__ import main
sys.argv = ["manager", *json.loads(sys.argv[1])]
code = main()
sys.stderr.write("\\nLOADED=" + json.dumps([m for m in {heavy!r} if m in sys.modules]))
sys.exit(code)
"""


def test_a_noop_sync_answers_before_loading_the_cli_stack(uv_checkout: Checkout) -> None:
    """The no-op decides "nothing to do" before httpx, rich and typer are imported (they
    were most of its wall time, issue 27), and says exactly what the full command says."""
    checkout = uv_checkout
    sync_ok(checkout)

    def probe(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        done = subprocess.run([sys.executable, "-c", _NOOP_PROBE.format(heavy=HEAVY),
                               json.dumps(["sync", *args])], cwd=checkout.root,
                              env=checkout.env, capture_output=True, text=True, timeout=120)
        head, _, loaded = done.stderr.rpartition("\nLOADED=")
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout,
                                           head), json.loads(loaded)

    def full(*args: str) -> subprocess.CompletedProcess[str]:  # the command line itself
        code = f"from manager.cli import main; raise SystemExit(main({['sync', *args]!r}))"
        return subprocess.run([sys.executable, "-c", code], cwd=checkout.root,
                              env=checkout.env, capture_output=True, text=True, timeout=120)

    for args in ((), ("--cpu",), ("--json",), ("--dry-run",), ("--cpu", "--json")):
        fast, loaded = probe(*args)
        assert fast.returncode == 0, fast.stderr
        assert loaded == [], (args, loaded)
        slow = full(*args)
        assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), args
    assert "Nothing to do" in probe()[0].stdout

    # Something to do: the full command line (and the lock) takes over.
    checkout.requirements("demo-req==1.0", "demo-extra==1.0")
    planned, loaded = probe("--dry-run")
    assert "Plan (" in planned.stdout and loaded == []  # a dry run changes nothing
    done, loaded = probe()
    assert done.returncode == 0, done.stderr
    assert set(loaded) >= {"rich", "typer"}
    assert "demo-extra" in checkout.installed()
