"""manager/detect.py: the pure parsers over captured text, and probe's shell behaviour."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from manager import detect
from manager.detect import NvidiaGpu
from tests.manager.hardware_fakes import (
    NVIDIA_FAILED,
    NVIDIA_QUERY,
    Answer,
    FakeMachine,
    fixture_text,
    nvidia_smi,
)

# ---- nvidia-smi CSV -------------------------------------------------------------------


def test_csv_rows():
    gpus, problems = detect.parse_nvidia_csv(
        "0, NVIDIA GeForce RTX 4090, 24564, 8.9, 560.35.03\n"
        "1, NVIDIA H100 80GB HBM3, 81559, 9.0, 560.35.03\n")
    assert problems == []
    assert gpus == [NvidiaGpu(0, "NVIDIA GeForce RTX 4090", 24564, "8.9", "560.35.03"),
                    NvidiaGpu(1, "NVIDIA H100 80GB HBM3", 81559, "9.0", "560.35.03")]


def test_csv_name_with_commas_is_read_from_both_ends():
    gpus, _ = detect.parse_nvidia_csv("3, NVIDIA RTX 6000, Ada Generation, rev 2, 49140, 8.9, "
                                      "580.95.05\n")
    assert gpus == [NvidiaGpu(3, "NVIDIA RTX 6000, Ada Generation, rev 2", 49140, "8.9",
                              "580.95.05")]


def test_csv_not_available_memory_and_compute_capability():
    gpus, problems = detect.parse_nvidia_csv(
        "0, NVIDIA GB10, [N/A], 12.1, 580.95.05\r\n"
        "1, NVIDIA Grid Thing, [Not Supported], [N/A], 580.95.05\r\n")
    assert problems == []
    assert gpus[0].memory_mib is None and gpus[0].compute_capability == "12.1"
    assert gpus[1].memory_mib is None and gpus[1].compute_capability is None


def test_csv_without_compute_capability_column():
    gpus, _ = detect.parse_nvidia_csv("0, NVIDIA GeForce GTX 1080, 8192, 470.256.02\n",
                                      with_cc=False)
    assert gpus == [NvidiaGpu(0, "NVIDIA GeForce GTX 1080", 8192, None, "470.256.02")]


def test_csv_garbage_rows_are_reported_not_fatal():
    gpus, problems = detect.parse_nvidia_csv(
        "No devices were found\nx, name, 1, 8.9, 1.0\n0, NVIDIA T4, 15360, 7.5, 580.95.05\n")
    assert [g.name for g in gpus] == ["NVIDIA T4"]
    assert len(problems) == 2


# ---- nvidia-smi banner ----------------------------------------------------------------


@pytest.mark.parametrize("fixture,cuda,driver", [
    ("banner-470.txt", "11.4", "470.256.02"),
    ("banner-535.txt", "12.2", "535.183.01"),
    ("banner-570.txt", "12.8", "570.172.08"),
    ("banner-580.txt", "13.0", "580.95.05"),
    ("banner-580-gb10.txt", "13.0", "580.95.05"),
    ("banner-590-umd.txt", "13.1", "590.48.01"),  # newer drivers: "CUDA UMD Version:"
    ("banner-windows-581.txt", "13.0", "581.57"),  # Windows layout, CRLF
])
def test_banner_cuda_version(fixture, cuda, driver):
    parsed = detect.parse_nvidia_banner(fixture_text(f"nvidia-smi/{fixture}"))
    assert parsed == {"cuda_version": cuda, "driver_version": driver}


def test_banner_without_cuda_version():
    parsed = detect.parse_nvidia_banner("| NVIDIA-SMI 580.95.05  Driver Version: 580.95.05  "
                                        "CUDA Version: N/A |")
    assert parsed["cuda_version"] is None


# ---- ROCm -----------------------------------------------------------------------------


def test_rocminfo_lists_gpu_agents_only():
    agents = detect.parse_rocminfo(fixture_text("rocm/rocminfo-mi300x.txt"))
    assert agents == [{"gfx": "gfx942", "name": "AMD Instinct MI300X"}]


def test_rocminfo_without_agents():
    assert detect.parse_rocminfo(fixture_text("rocm/rocminfo-no-gpu.txt")) == []


def test_rocm_smi_product_names():
    cards = detect.parse_rocm_smi_products(fixture_text("rocm/rocm-smi-productname-mi300x.txt"))
    assert cards == [{"gfx": "gfx942", "name": "AMD Instinct MI300X OAM"}]


def test_rocm_version_file():
    assert detect.parse_rocm_version(fixture_text("rocm/info-version.txt")) == "7.1.0"
    assert detect.parse_rocm_version("garbage") is None


# ---- platform facts -------------------------------------------------------------------


@pytest.mark.parametrize("machine,os_name,arch", [
    ("AMD64", "windows", "x86_64"),
    ("amd64", "linux", "x86_64"),
    ("x86_64", "linux", "x86_64"),
    ("arm64", "linux", "aarch64"),
    ("aarch64", "linux", "aarch64"),
    ("ARM64", "windows", "aarch64"),
    ("arm64", "darwin", "arm64"),
    ("x86_64", "darwin", "x86_64"),
])
def test_arch_normalisation(machine, os_name, arch):
    assert detect.normalise_arch(machine, os_name) == arch


@pytest.mark.parametrize("system,expected", [("Linux", "linux"), ("Darwin", "darwin"),
                                             ("Windows", "windows"), ("CYGWIN_NT-10.0", "windows")])
def test_os_normalisation(system, expected):
    assert detect.normalise_os(system) == expected


@pytest.mark.parametrize("release,env,kind", [
    ("5.15.167.4-microsoft-standard-WSL2", {}, 2),
    ("4.4.0-19041-Microsoft", {}, 1),
    ("6.8.0-49-generic", {}, 0),
    ("6.6.87.2-custom", {"WSL_INTEROP": "/run/WSL/1_interop"}, 2),
])
def test_wsl(release, env, kind):
    assert detect.wsl_kind("linux", release, env) == kind


@pytest.mark.parametrize("os_name,arch,names,expected", [
    ("linux", "aarch64", ["NVIDIA GB10"], "GB10"),
    ("linux", "aarch64", ["NVIDIA GH200 480GB"], "GH200"),
    ("linux", "aarch64", ["NVIDIA GB200"], "GB200"),
    ("linux", "aarch64", ["NVIDIA A100-SXM4-80GB"], None),  # aarch64 + NVIDIA is not a DGX
    ("linux", "x86_64", ["NVIDIA GH200 480GB"], None),
    ("linux", "aarch64", [], None),
])
def test_grace_platform(os_name, arch, names, expected):
    assert detect.grace_platform(os_name, arch, names) == expected


# ---- probe (the shell) ----------------------------------------------------------------


def test_probe_failed_nvidia_smi_is_reported(fake_machine):
    env = fake_machine(FakeMachine(tools={"nvidia-smi": {
        NVIDIA_QUERY: Answer(NVIDIA_FAILED, rc=9), "": Answer(NVIDIA_FAILED, rc=9)}}))
    d = detect.probe(env).to_dict()
    assert d["nvidia"]["found"] and not d["nvidia"]["ok"]
    assert "exited with code 9" in d["nvidia"]["error"]
    assert "couldn't communicate" in d["nvidia"]["error"]
    assert any("NVIDIA:" in n for n in d["notes"])


def test_probe_nvidia_smi_that_hangs_times_out(fake_machine, monkeypatch):
    monkeypatch.setattr(detect, "TOOL_TIMEOUT_S", 0.5)
    env = fake_machine(FakeMachine())
    smi = env["PATH"].split(":")[0] + "/nvidia-smi"
    with open(smi, "w") as fh:
        fh.write(f"#!/bin/sh\nexec {shutil.which('sleep')} 30\n")  # bounded, even if broken
    os.chmod(smi, 0o755)
    d = detect.probe(env).to_dict()
    assert d["nvidia"]["ok"] is False and "did not answer" in d["nvidia"]["error"]


def test_probe_no_gpu_listed_is_not_ok(fake_machine):
    env = fake_machine(FakeMachine(tools={"nvidia-smi": {NVIDIA_QUERY: Answer(""),
                                                         "": Answer("")}}))
    d = detect.probe(env).to_dict()
    assert d["nvidia"]["ok"] is False and "no GPU" in d["nvidia"]["error"]


def test_probe_unknown_cuda_when_banner_fails(fake_machine):
    env = fake_machine(FakeMachine(tools={"nvidia-smi": {
        NVIDIA_QUERY: Answer("0, NVIDIA L4, 23034, 8.9, 580.95.05\n"), "": Answer(rc=1)}}))
    d = detect.probe(env).to_dict()
    assert d["nvidia"]["ok"] and d["nvidia"]["cuda_version"] is None
    assert any("CUDA version" in n for n in d["notes"])


def test_probe_rocm_needs_an_answering_runtime(fake_machine, tmp_path):
    """A ROCm folder alone is not ROCm; rocm-smi is the fallback when rocminfo is absent."""
    env = fake_machine(FakeMachine(rocm_version="7.1.0-38"))  # .info/version, no tools
    assert detect.probe(env).rocm["found"] is False
    env = fake_machine(FakeMachine(rocm_version="7.1.0-38", tools={"rocm-smi": {
        "--showproductname": Answer(fixture_text("rocm/rocm-smi-productname-mi300x.txt"))}}))
    rocm = detect.probe(env).rocm
    assert rocm["ok"] and rocm["version"] == "7.1.0" and rocm["gpus"][0]["gfx"] == "gfx942"


def test_probe_skips_rocm_when_nvidia_works(fake_machine):
    machine = FakeMachine(tools={
        "nvidia-smi": nvidia_smi("0, NVIDIA L4, 23034, 8.9, 580.95.05\n", "banner-580.txt"),
        "rocminfo": {"": Answer(fixture_text("rocm/rocminfo-mi300x.txt"))}})
    d = detect.probe(fake_machine(machine))
    assert d.nvidia["ok"] and d.rocm == {}


def test_probe_records_platform_overrides(fake_machine):
    d = detect.probe(fake_machine(FakeMachine(os="Darwin", arch="arm64", release="15.1")))
    assert (d.os, d.arch, d.os_release) == ("darwin", "arm64", "15.1")
    assert any("AITK_HOST_OS=Darwin" in n for n in d.notes)
    assert d.nvidia == {}  # no nvidia-smi probing on macOS


def test_probe_real_host_has_no_override_note(monkeypatch):
    d = detect.probe({"PATH": "/nonexistent"})
    assert not any("overridden" in n for n in d.notes)
    assert d.python and d.os in ("linux", "darwin", "windows")


def test_probe_never_raises(monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("platform exploded")

    monkeypatch.setattr(detect.platform, "system", boom)
    monkeypatch.setattr(detect, "probe_nvidia", boom)
    d = detect.probe({"PATH": "/nonexistent"})
    assert any("platform exploded" in n for n in d.notes)


def test_detection_to_dict_is_plain_json():
    d = detect.Detection("linux", "x86_64", "3.11.7", notes=("a",))
    assert json.loads(json.dumps(d.to_dict()))["notes"] == ["a"]
