"""The pure parts of doctor: judgements over plain data, redaction, probe isolation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from manager.health import checkout, hazards, install, secrets, tooling, torchstack
from manager.health.check import FIX_INSTALL, Probe, Status, ok, run_probes
from manager.repo import RepoStatus

GIB = 1024**3


@pytest.mark.parametrize("capability, archs, covered", [
    ((8, 6), ["sm_80", "sm_90"], True),  # same major, lower minor: binary compatible
    ((8, 0), ["sm_86"], False),  # a newer minor does not run on an older device
    ((12, 0), ["sm_80", "sm_90", "sm_100"], False),  # Blackwell on an older build
    ((12, 0), ["sm_90", "compute_90"], True),  # PTX JIT-compiles forward
    ((9, 0), ["sm_90a"], True),
    ((10, 0), ["sm_90a"], False),  # arch-specific targets only run on their own chip
    ((12, 1), ["sm_120"], True),
])
def test_arch_coverage(capability, archs, covered):
    assert torchstack.arch_covers(capability, archs) is covered


@pytest.mark.parametrize("installed, pinned, matches", [
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("2.13.0+cu130", "2.13.0+cpu", False),
    ("2.13.0+cu130", "2.13.0", True),  # a PyPI pin accepts any local build
    ("2.12.1", "2.13.0", False),
    (None, "2.13.0", False),
])
def test_version_matches(installed, pinned, matches):
    assert torchstack.version_matches(installed, pinned) is matches


def expected(backend: str, gpu_detected: bool = False) -> torchstack.Expected:
    return torchstack.Expected(backend, (torchstack.Pin("torch", "2.13.0+cu130", True),),
                               gpu_detected)


def stack_report(**runtime: object) -> dict:
    return {"packages": {"torch": {"ok": True, "version": "2.13.0+cu130"},
                         "torchvision": {"ok": True, "version": "0.28.0"},
                         "torchaudio": {"ok": True, "version": "2.11.0"}},
            "runtime": {"cuda": "13.0", "hip": None, "mps_available": False, **runtime}}


def gpu_check(exp: torchstack.Expected, report: dict):
    return {c.id: c for c in torchstack.judge_stack(exp, report, None)}["gpu"]


def test_gpu_not_visible_fails():
    check = gpu_check(expected("cuda"), stack_report(gpu_available=False))
    assert check.status is Status.FAIL and "sees no GPU" in check.detail


def test_gpu_outside_the_arch_list_fails():
    report = stack_report(gpu_available=True, arch_list=["sm_80", "sm_90"],
                          devices=[{"name": "RTX 5090", "capability": [12, 0]}])
    check = gpu_check(expected("cuda"), report)
    assert check.status is Status.FAIL
    assert "RTX 5090 (sm_120) is not in torch's arch list (sm_80 sm_90)" in check.detail


def test_gpu_covered_is_ok():
    report = stack_report(gpu_available=True, arch_list=["sm_90", "sm_120"],
                          devices=[{"name": "GB10", "capability": [12, 1]}])
    assert gpu_check(expected("dgx"), report).detail == "torch sees GB10 (sm_121)"


def test_several_gpus_say_whether_nccl_lets_them_train_together():
    two = [{"name": "H200", "capability": [9, 0]}] * 2
    report = stack_report(gpu_available=True, arch_list=["sm_90"], devices=two, nccl=True)
    check = gpu_check(expected("cuda"), report)
    assert check.status.value == "OK" and check.detail.endswith(
        "NCCL available: train on all with --gpus 2")
    report = stack_report(gpu_available=True, arch_list=["sm_90"], devices=two, nccl=False)
    check = gpu_check(expected("cuda"), report)
    assert check.status.value == "WARN" and "NCCL is missing" in check.detail


def test_rocm_arch_by_gfx_name():
    report = stack_report(cuda=None, hip="7.1", gpu_available=True, arch_list=["gfx942"],
                          devices=[{"name": "MI300X", "capability": [9, 4],
                                    "gcn_arch": "gfx942:sramecc+:xnack-"}])
    assert gpu_check(expected("rocm"), report).status is Status.OK


def test_cuda_build_where_the_spec_wants_cpu_fails():
    check = gpu_check(expected("cpu"), stack_report())
    assert check.status is Status.FAIL and "CUDA 13.0 build" in check.detail


def test_cpu_build_with_a_gpu_present_warns():
    report = stack_report(cuda=None)
    check = gpu_check(expected("cpu", gpu_detected=True), report)
    assert check.status is Status.WARN and "without --cpu" in check.fix


def test_crashed_venv_python_fails_every_stack_line():
    checks = torchstack.judge_stack(expected("cuda"), None, "crashed: Segmentation fault")
    assert [c.status for c in checks] == [Status.FAIL] * 4


def test_refused_spec_fails():
    check = torchstack.judge_spec(None, "driver 470 is too old for CUDA 13", refused=True)
    assert check.status is Status.FAIL and "driver 470" in check.detail


def test_refused_spec_with_nothing_installed_names_install_cpu():
    """No state, so no recorded --cpu: the refusal says "run again with --cpu", which
    doctor does not take; the fix names the command that does."""
    check = torchstack.judge_spec(None, "no supported GPU found; run again with --cpu",
                                  refused=True, installed=False)
    assert check.status is Status.FAIL and check.fix.startswith(
        "without a supported GPU: ./install.sh --cpu")


@pytest.mark.parametrize("free_gib, status", [(2, Status.FAIL), (10, Status.WARN),
                                              (200, Status.OK)])
def test_disk_thresholds(free_gib, status):
    places = [checkout.Place("checkout", Path("/c"), 500 * GIB),
              checkout.Place("models (HF cache)", Path("/m"), free_gib * GIB)]
    check = checkout.judge_disk(places)
    assert check.status is status
    if status is not Status.OK:
        assert "/m" in check.fix


def test_disk_fix_fits_the_place_that_is_low():
    low_checkout = [checkout.Place("checkout", Path("/c"), 2 * GIB),
                    checkout.Place("models (HF cache)", Path("/m"), 500 * GIB)]
    check = checkout.judge_disk(low_checkout)
    assert "/c" in check.fix and "HF_HOME" not in check.fix  # HF_HOME cannot move .venv
    low_cache = [checkout.Place("checkout", Path("/c"), 500 * GIB),
                 checkout.Place("models (HF cache)", Path("/m"), 2 * GIB)]
    assert "HF_HOME" in checkout.judge_disk(low_cache).fix
    assert checkout.judge_disk([]).fix  # not OK, so it carries a fix


def test_checkout_behind_and_detached():
    behind = RepoStatus("main", "a" * 40, "origin/main", behind=3)
    check = checkout.judge_checkout(behind)
    assert check.status is Status.WARN and "3 commit(s) behind origin/main" in check.detail
    assert check.fix == "python3 -m manager update"
    detached = checkout.judge_checkout(RepoStatus(None, "b" * 40, None))
    assert detached.status is Status.WARN and "detached HEAD" in detached.detail
    clean = checkout.judge_checkout(RepoStatus("main", "c" * 40, "origin/main", behind=0))
    assert clean.status is Status.OK and clean.detail.endswith("up to date")


def test_hf_cache_location():
    assert checkout.hf_cache({"HF_HOME": "/big/hf"}) == Path("/big/hf")
    assert checkout.hf_cache({"HF_HUB_CACHE": "/x", "HF_HOME": "/y"}) == Path("/x")


def test_accelerator_outcomes():
    assert install.judge_accelerators({}).status is Status.OK
    skipped = install.judge_accelerators({"natten": {"status": "unavailable",
                                                     "reason": "no wheel for cu130"}})
    assert skipped.status is Status.OK and "no wheel for cu130" in skipped.detail
    assert install.judge_accelerators(None).status is Status.WARN


def test_caller_environment_restores_what_the_bootstrap_dropped():
    environ = {"PYTHONPATH": "/checkout", "HOME": "/h",
               hazards.DROPPED_VAR: json.dumps({"PYTHONPATH": "/mine", "CONDA_PREFIX": "/c"})}
    assert hazards.caller_environment(environ) == {"HOME": "/h", "PYTHONPATH": "/mine",
                                                   "CONDA_PREFIX": "/c"}
    # The bootstrap's own PYTHONPATH is not the user's.
    environ[hazards.DROPPED_VAR] = "{}"
    assert "PYTHONPATH" not in hazards.caller_environment(environ)


def test_secret_names_and_redaction():
    environ = {"HF_TOKEN": "hf_abcdef", "GITHUB_TOKEN": "ghp_123456", "DB_PASSWORD": "hunter22",
               "GIT_AUTHOR_NAME": "Ann", "PATH": "/bin", "AITK_AUTH": "user:pass"}
    names = secrets.secret_names(environ)
    assert names[:3] == ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AITK_AUTH"]
    assert "GITHUB_TOKEN" in names and "DB_PASSWORD" in names
    assert "GIT_AUTHOR_NAME" not in names and "PATH" not in names
    text = "tok hf_abcdef pw hunter22 url https://u:p@host/x auth user:pass"
    assert secrets.redact(text, secrets.secret_values(environ)) == (
        "tok *** pw *** url https://***@host/x auth ***")


def test_a_hung_probe_is_reported_and_the_rest_still_run():
    release = threading.Event()

    def hang():
        release.wait(60)
        return [ok("slow", "finished")]

    try:
        checks = run_probes([Probe(("slow",), hang, 0.2),
                             Probe(("fast",), lambda: [ok("fast", "fine")], 5.0),
                             Probe(("quiet", "forgot"), lambda: [ok("quiet", "x")], 5.0)])
    finally:
        release.set()
    by_id = {c.id: c for c in checks}
    assert [c.id for c in checks] == ["slow", "fast", "quiet", "forgot"]
    assert by_id["slow"].status is Status.WARN and "timed out" in by_id["slow"].detail
    assert by_id["fast"].status is Status.OK
    assert by_id["forgot"].detail == "could not check: the probe reported nothing"


def test_not_implemented_reads_plainly():
    def stub():
        raise NotImplementedError

    (check,) = run_probes([Probe(("x",), stub, 5.0)])
    assert check.detail == "could not check: not implemented in this version"


def test_doctor_reads_the_keys_the_real_tools_report_has(tmp_path, monkeypatch):
    """Contract between manager.tools.report_tools and doctor: a key mismatch once made
    doctor ignore the report and fall back to PATH (missing the checkout's .uv/)."""
    from manager.health import tooling
    from manager.paths import Paths
    from manager.tools import report_tools

    rows = report_tools(Paths(tmp_path))
    assert {r["tool"] for r in rows} >= {"uv", "node", "ffmpeg", "git"}
    for row in rows:
        assert {"tool", "used", "version", "path", "ok", "minimum"} <= set(row)
    monkeypatch.setattr("manager.tools.report_tools",
                        lambda paths: [{**r, "used": "local", "path": "/checkout/.x", "ok": True}
                                       for r in rows])
    checks = {c.id: c for c in tooling.probe(Paths(tmp_path))}
    assert "local: /checkout/.x" in checks["tool.uv"].detail


def test_a_multi_line_reason_becomes_one_line_of_detail():
    from manager.health.install import judge_accelerators

    check = judge_accelerators({"torchcodec": {"status": "rolled_back",
                                               "detail": "RuntimeError: no lib\n  1. cause\n"},
                                "triton": {"status": "unavailable", "detail": "no GPU"}})
    assert "\n" not in check.detail
    assert "torchcodec rolled_back (RuntimeError: no lib)" in check.detail


def test_torchcodec_fix_speaks_of_ffmpeg_not_attention():
    check = install.judge_accelerators({"torchcodec": {"status": "rolled_back",
                                                       "detail": "no libavutil"}})
    assert "attention" not in check.fix.lower()
    assert "FFmpeg" in check.fix
    flash = install.judge_accelerators({"flash-attn": {"status": "install_failed",
                                                       "detail": "no wheel"}})
    assert "attention falls back to PyTorch SDPA" in flash.fix


def test_missing_ffmpeg_says_what_it_is_for_today():
    check = tooling.judge_tool("ffmpeg", None)
    assert "torchcodec" in check.detail and "trainer itself does not need" in check.detail
    # video datasets exist, and do not need the program (PyAV bundles FFmpeg's libraries)
    assert "video datasets decode through PyAV" in check.detail


# ---- fixes that can work: what a plain sync would do again is not a fix ---------------

def companion_expected() -> torchstack.Expected:
    return torchstack.Expected("cpu", (torchstack.Pin("torch", "2.13.0+cpu", True),
                                       torchstack.Pin("torchvision", "0.28.0+cpu", False),
                                       torchstack.Pin("torchaudio", "2.11.0+cpu", False)))


def missing(*names: str) -> dict:
    packages = {"torch": {"ok": True, "version": "2.13.0+cpu"},
                "torchvision": {"ok": True, "version": "0.28.0+cpu"},
                "torchaudio": {"ok": True, "version": "2.11.0+cpu"}}
    for name in names:
        packages[name] = {"ok": False, "error": f"ModuleNotFoundError: No module named '{name}'"}
    return {"packages": packages, "runtime": {"cuda": None, "hip": None}}


def stack_checks(report: dict, recorded: dict | None = None) -> dict:
    return {c.id: c for c in torchstack.judge_stack(companion_expected(), report, None,
                                                    recorded)}


@pytest.mark.parametrize("status, said", [
    ("install_failed", "could not be installed by the last sync (no torchvision==0.28.0+cpu)"),
    ("removed", "was removed by the last sync: it does not import (no torchvision==0.28.0+cpu)"),
])
def test_companion_the_sync_gave_up_on_names_a_source_not_sync(status, said):
    recorded = {"torchvision": {"status": status, "version": "0.28.0+cpu",
                                "detail": "no torchvision==0.28.0+cpu"}}
    check = stack_checks(missing("torchvision"), recorded)["torchvision"]
    assert check.status is Status.WARN
    assert said in check.detail
    # A plain sync skips a recorded failure, so "sync" alone cannot be the fix.
    assert "AITK_TORCH_INDEX_URL" in check.fix and "torchvision==0.28.0+cpu" in check.fix
    assert "the trainer does not need it" in check.fix


def test_companion_missing_without_a_recorded_failure_is_fixed_by_sync():
    assert stack_checks(missing("torchaudio"))["torchaudio"].fix == "python3 -m manager sync"
    # A failure recorded for another pin is retried by the next sync.
    old = {"torchaudio": {"status": "install_failed", "version": "2.10.0+cpu", "detail": "x"}}
    assert stack_checks(missing("torchaudio"), old)["torchaudio"].fix == (
        "python3 -m manager sync")


def test_nothing_installed_points_every_stack_check_at_install():
    checks = stack_checks(missing("torch", "torchvision", "torchaudio"))
    for name in ("torch", "torchvision", "torchaudio", "gpu"):
        assert checks[name].fix == FIX_INSTALL, name


def test_nothing_installed_requirements_fix_is_install():
    from manager.envstatus import NOT_INSTALLED

    assert install.judge_sync(False, [NOT_INSTALLED]).fix == FIX_INSTALL
    assert install.judge_sync(False, ["requirements.txt changed"]).fix == (
        "python3 -m manager sync")


def test_failed_optional_retry_is_a_forced_sync():
    check = install.judge_accelerators({"flash-attn": {"status": "install_failed",
                                                       "detail": "no wheel"}})
    # A plain sync does not try a recorded failure again (plan.py); --force does.
    assert check.fix.endswith("python3 -m manager sync --force")
    assert "flash-attn" in check.fix


def test_a_tool_the_manager_refuses_to_provision_is_not_fixed_by_sync():
    info = {"tool": "ffmpeg", "used": None, "minimum": "6.0"}
    unverified = tooling.judge_tool("ffmpeg", info, True, "install a system ffmpeg, or "
                                    "accept the risk with AITK_ALLOW_UNVERIFIED=ffmpeg")
    assert "sync" not in unverified.fix
    assert unverified.fix.endswith("AITK_ALLOW_UNVERIFIED=ffmpeg, then run "
                                   "python3 -m manager tools --provision")
    unsupported = tooling.judge_tool("ffmpeg", info, True, None)
    assert unsupported.fix.startswith("install ffmpeg 6.0 or newer from your system")
    assert tooling.judge_tool("ffmpeg", info).fix == "python3 -m manager sync"


def test_refusals_follow_the_opt_in():
    from manager.tools.pins import LINUX_X64, MACOS_ARM64, PINS

    # FFmpeg's wheel is verifiable: never refused, with or without the opt-in (which asks
    # for the unverified shared build where one is pinned, else keeps the wheel).
    assert PINS["ffmpeg"].checksum_source.startswith("PyPI")
    for env in ({}, {"AITK_ALLOW_UNVERIFIED": "ffmpeg"}):
        assert "ffmpeg" not in tooling.refusals(env, LINUX_X64)
        assert "ffmpeg" not in tooling.refusals(env, MACOS_ARM64)
    assert "uv" not in tooling.refusals({}, LINUX_X64)
    assert "git" in tooling.refusals({}, LINUX_X64)  # not provisioned outside Windows
    assert "git" not in tooling.refusals({"AITK_ALLOW_UNVERIFIED": "git"}, ("windows", "x86_64"))
    assert "git" in tooling.refusals({}, ("windows", "x86_64"))  # no digest: opt-in named
    assert tooling.refusals({}, ("windows", "x86_64"))["git"].hint
