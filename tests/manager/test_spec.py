"""spec.py: the hardware profile table (fake drivers on PATH -> probe -> make_spec, in
process and through the real CLI), plus one test per rule over plain detection dicts."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import spec
from manager import detect
from tests.manager.hardware_fakes import (
    NVIDIA_FAILED,
    NVIDIA_QUERY,
    NVIDIA_QUERY_OLD,
    Answer,
    FakeMachine,
    fixture_text,
    nvidia_smi,
)

ROOT = Path(__file__).resolve().parents[2]

# ---- the profile table ----------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    backend: str | None = None  # None: refused
    flavour: str | None = None
    refused: tuple[str, ...] = ()  # substrings of the refusal message
    warning: str | None = None  # substring of one warning
    requirements_file: str = "requirements.txt"
    detected: dict[str, Any] = field(default_factory=dict)  # "nvidia.cuda_version": "12.2"


def _csv(*rows: str) -> str:
    return "".join(row + "\n" for row in rows)


SYSCTL_M3 = {"-n machdep.cpu.brand_string": Answer("Apple M3 Max\n"),
             "-n sysctl.proc_translated": Answer("0\n")}
SYSCTL_INTEL = {"-n machdep.cpu.brand_string":
                Answer("Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz\n"),
                "-n sysctl.proc_translated":
                Answer(rc=1, stderr="sysctl: unknown oid 'sysctl.proc_translated'\n")}
SYSCTL_ROSETTA = {"-n machdep.cpu.brand_string": Answer("Apple M2\n"),
                  "-n sysctl.proc_translated": Answer("1\n")}
ROCM_MI300X = {
    "rocminfo": {"": Answer(fixture_text("rocm/rocminfo-mi300x.txt"))},
    "rocm-smi": {"--showproductname": Answer(fixture_text("rocm/rocm-smi-productname-mi300x.txt"))},
}
FAILING_SMI = {NVIDIA_QUERY: Answer(NVIDIA_FAILED, rc=9), "": Answer(NVIDIA_FAILED, rc=9)}

PROFILES: dict[str, tuple[FakeMachine, bool, Expect]] = {
    "rtx3090-driver535": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 3090, 24576, 8.6, 535.183.01"), "banner-535.txt")}),
        False,
        Expect(refused=("535.183.01", "CUDA 12.2", "580"),
               detected={"nvidia.cuda_version": "12.2", "nvidia.gpus.0.memory_mib": 24576}),
    ),
    "rtx4090-cuda12.6": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 4090, 24564, 8.9, 560.35.03"), "banner-560.txt")}),
        False,
        Expect("cuda", "cu126", warning="update to driver 580",
               detected={"nvidia.cuda_version": "12.6", "nvidia.driver_version": "560.35.03"}),
    ),
    "rtx4090-cuda12.8": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 4090, 24564, 8.9, 570.172.08"), "banner-570.txt")}),
        False,
        Expect("cuda", "cu126", warning="CUDA 12.8"),
    ),
    "rtx5090-cuda12.8": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 5090, 32607, 12.0, 570.172.08"), "banner-570.txt")}),
        False,
        Expect(refused=("RTX 5090", "driver 580 or newer", "12.8")),
    ),
    "rtx5090-cuda13.0": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 5090, 32607, 12.0, 580.95.05"), "banner-580.txt")}),
        False,
        Expect("cuda", "cu130", detected={"nvidia.gpus.0.compute_capability": "12.0"}),
    ),
    "h100x2": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(_csv(
            "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 580.95.05",
            "1, NVIDIA H100 80GB HBM3, 81559, 9.0, 580.95.05"), "banner-580.txt")}),
        False,
        Expect("cuda", "cu130", detected={"nvidia.gpus.1.index": 1, "dgx.is_dgx": False}),
    ),
    "b200-umd-banner": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA B200, 183359, 10.0, 590.48.01"), "banner-590-umd.txt")}),
        False,
        Expect("cuda", "cu130", detected={"nvidia.cuda_version": "13.1"}),
    ),
    "b200-cuda12.8": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA B200, 183359, 10.0, 570.172.08"), "banner-570.txt")}),
        False,
        Expect(refused=("B200", "580")),
    ),
    "dgx-spark-gb10": (
        FakeMachine(arch="aarch64", release="6.11.0-1016-nvidia", tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GB10, [N/A], 12.1, 580.95.05"), "banner-580-gb10.txt")}),
        False,
        Expect("dgx", "cu130", requirements_file="dgx_requirements.txt",
               detected={"dgx.platform": "GB10", "nvidia.gpus.0.memory_mib": None,
                         "arch": "aarch64"}),
    ),
    "gh200": (
        FakeMachine(arch="aarch64", tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GH200 480GB, 97871, 9.0, 580.95.05"), "banner-580.txt")}),
        False,
        Expect("dgx", "cu130", requirements_file="dgx_requirements.txt",
               detected={"dgx.platform": "GH200"}),
    ),
    "a100-on-arm64-not-dgx": (
        FakeMachine(arch="arm64", tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA A100-SXM4-80GB, 81920, 8.0, 580.95.05"), "banner-580.txt")}),
        False,
        Expect("cuda", "cu130", detected={"dgx.is_dgx": False, "arch": "aarch64"}),
    ),
    "mixed-4090-1080ti": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(_csv(
            "0, NVIDIA GeForce RTX 4090, 24564, 8.9, 580.95.05",
            "1, NVIDIA GeForce GTX 1080 Ti, 11264, 6.1, 580.95.05"), "banner-580.txt")}),
        False,
        Expect("cuda", "cu130", warning="GTX 1080 Ti"),
    ),
    "mixed-3090-5090-cuda12.8": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(_csv(
            "0, NVIDIA GeForce RTX 3090, 24576, 8.6, 570.172.08",
            "1, NVIDIA GeForce RTX 5090, 32607, 12.0, 570.172.08"), "banner-570.txt")}),
        False,
        Expect(refused=("RTX 5090", "580")),
    ),
    "p100-only-driver580": (
        FakeMachine(tools={"nvidia-smi": nvidia_smi(
            _csv("0, Tesla P100-PCIE-16GB, 16384, 6.0, 580.95.05"), "banner-580.txt")}),
        False,
        Expect("cuda", "cu126"),
    ),
    "gtx1080-driver470-no-compute-cap": (
        FakeMachine(tools={"nvidia-smi": {
            NVIDIA_QUERY: Answer('Field "compute_cap" is not a valid field to query.\n', rc=2),
            NVIDIA_QUERY_OLD: Answer(_csv("0, NVIDIA GeForce GTX 1080, 8192, 470.256.02")),
            "": Answer(fixture_text("nvidia-smi/banner-470.txt"))}}),
        False,
        Expect(refused=("CUDA 11.4",), detected={"nvidia.gpus.0.compute_capability": None,
                                                  "nvidia.gpus.0.name": "NVIDIA GeForce GTX 1080"}),
    ),
    "failing-nvidia-smi": (
        FakeMachine(tools={"nvidia-smi": FAILING_SMI}),
        False,
        Expect(refused=("couldn't communicate with the NVIDIA driver",),
               detected={"nvidia.found": True, "nvidia.ok": False}),
    ),
    "failing-nvidia-smi-cpu": (
        FakeMachine(tools={"nvidia-smi": FAILING_SMI}),
        True,
        Expect("cpu", "cpu", warning="couldn't communicate"),
    ),
    "windows-rtx4070": (
        FakeMachine(os="Windows", arch="AMD64", release="10", tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 4070, 12282, 8.9, 581.57"), "banner-windows-581.txt",
            crlf=True)}),
        False,
        Expect("cuda", "cu130", detected={"os": "windows", "arch": "x86_64",
                                          "nvidia.cuda_version": "13.0"}),
    ),
    "wsl2-rtx4090": (
        FakeMachine(release="5.15.167.4-microsoft-standard-WSL2", tools={"nvidia-smi": nvidia_smi(
            _csv("0, NVIDIA GeForce RTX 4090, 24564, 8.9, 581.57"), "banner-580.txt")}),
        False,
        Expect("cuda", "cu130", detected={"wsl": True}),
    ),
    "mi300x-rocm": (
        FakeMachine(tools=ROCM_MI300X, rocm_version="7.1.0-38"),
        False,
        Expect("rocm", "rocm7.1", detected={"rocm.version": "7.1.0", "rocm.gpus.0.gfx": "gfx942",
                                            "rocm.gpus.0.name": "AMD Instinct MI300X"}),
    ),
    "rocm-installed-no-gpu": (
        FakeMachine(tools={"rocminfo": {"": Answer(fixture_text("rocm/rocminfo-no-gpu.txt"),
                                                  rc=1)}}, rocm_version="6.4.1"),
        False,
        Expect(refused=("--cpu",), detected={"rocm.found": True, "rocm.ok": False}),
    ),
    "apple-m3": (
        FakeMachine(os="Darwin", arch="arm64", release="14.5", tools={"sysctl": SYSCTL_M3}),
        False,
        Expect("mps", "pypi", detected={"apple.chip": "Apple M3 Max", "apple.mps": True,
                                        "arch": "arm64"}),
    ),
    "intel-mac": (
        FakeMachine(os="Darwin", arch="x86_64", release="13.6.7", tools={"sysctl": SYSCTL_INTEL}),
        True,
        Expect(refused=("Intel Mac",), detected={"apple.silicon": False, "apple.mps": False}),
    ),
    "rosetta-python": (
        FakeMachine(os="Darwin", arch="x86_64", release="15.1", tools={"sysctl": SYSCTL_ROSETTA}),
        False,
        Expect(refused=("Rosetta",), detected={"apple.rosetta": True, "apple.silicon": True}),
    ),
    "cpu-only": (
        FakeMachine(), False, Expect(refused=("--cpu",), detected={"nvidia.found": False}),
    ),
    "cpu-only-with-cpu": (
        FakeMachine(), True, Expect("cpu", "cpu"),
    ),
}
# Run through the real `python -m manager detect/spec --json` as well.
CLI_PROFILES = ("rtx3090-driver535", "rtx4090-cuda12.6", "rtx5090-cuda12.8", "rtx5090-cuda13.0",
                "b200-umd-banner", "dgx-spark-gb10", "failing-nvidia-smi", "mi300x-rocm",
                "apple-m3", "intel-mac", "cpu-only", "cpu-only-with-cpu")


def lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def check_detection(data: dict[str, Any], expect: Expect) -> None:
    for key, value in expect.detected.items():
        assert lookup(data, key) == value, key


def check_spec(result: spec.Spec | spec.SpecRefused, expect: Expect) -> None:
    if expect.backend is None:
        assert isinstance(result, spec.SpecRefused), f"expected a refusal, got {result}"
        for part in expect.refused:
            assert part in result.message
        return
    assert isinstance(result, spec.Spec), f"refused: {result}"
    assert (result.backend, result.flavour) == (expect.backend, expect.flavour)
    assert result.requirements_file == expect.requirements_file
    if expect.warning:
        assert any(expect.warning in w for w in result.warnings), result.warnings
    else:
        assert result.warnings == ()


def spec_or_refusal(detection: dict[str, Any], cpu: bool) -> spec.Spec | spec.SpecRefused:
    try:
        return spec.make_spec(detection, cpu=cpu)
    except spec.SpecRefused as refused:
        return refused


def test_profile_table_is_large_enough():
    assert len(PROFILES) >= 15


@pytest.mark.parametrize("name", list(PROFILES))
def test_profile(name, fake_machine):
    machine, cpu, expect = PROFILES[name]
    detection = detect.probe(fake_machine(machine)).to_dict()
    check_detection(detection, expect)
    check_spec(spec_or_refusal(detection, cpu), expect)


@pytest.fixture
def cli(manager_cli):
    def run(*args: str, env: dict[str, str]):
        return manager_cli(*args, env=env, cwd=ROOT)

    return run


@pytest.mark.parametrize("name", CLI_PROFILES)
def test_profile_through_cli(name, fake_machine, cli):
    machine, cpu, expect = PROFILES[name]
    env = {**fake_machine(machine), "NO_COLOR": "1"}
    found = cli("detect", "--json", env=env)
    assert found.returncode == 0, found.stderr
    check_detection(json.loads(found.stdout)["data"], expect)

    made = cli("spec", "--json", *(["--cpu"] if cpu else []), env=env)
    doc = json.loads(made.stdout)
    if expect.backend is None:
        assert made.returncode == 3
        assert doc["error"]["type"] == "UnsupportedMachine"
        for part in expect.refused:
            assert part in doc["error"]["message"]
    else:
        assert made.returncode == 0, made.stderr
        data = doc["data"]
        assert (data["backend"], data["flavour"]) == (expect.backend, expect.flavour)
        assert data["requirements_file"] == expect.requirements_file


def test_spec_from_round_trip(fake_machine, tmp_path, cli):
    """detect --json on one machine -> file -> spec --from elsewhere gives the same spec."""
    machine, _, _ = PROFILES["dgx-spark-gb10"]
    env = {**fake_machine(machine), "NO_COLOR": "1"}
    saved = tmp_path / "detect.json"
    saved.write_text(cli("detect", "--json", env=env).stdout)
    direct = json.loads(cli("spec", "--json", env=env).stdout)["data"]

    bare_env = {"PATH": "/nonexistent", "NO_COLOR": "1"}  # this machine: no GPU at all
    replayed = json.loads(cli("spec", "--json", "--from", str(saved), env=bare_env).stdout)
    assert replayed["data"] == direct
    assert replayed["data"]["backend"] == "dgx"

    bare = tmp_path / "bare.json"  # the bare data (no envelope) is accepted too
    bare.write_text(json.dumps(json.loads(saved.read_text())["data"]))
    again = json.loads(cli("spec", "--json", "--from", str(bare), env=bare_env).stdout)
    assert again["data"]["install_fingerprint"] == direct["install_fingerprint"]


# ---- one test per rule, over plain detection dicts ------------------------------------


def machine(os_name="linux", arch="x86_64", python="3.11.7", **parts: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"os": os_name, "arch": arch, "python": python, "wsl": False,
                         "nvidia": {}, "rocm": {}, "apple": {}, "dgx": {}, "notes": [],
                         "os_release": ""}
    d.update(parts)
    return d


def nvidia(*gpus: tuple[str, str | None], cuda: str | None = "13.0", driver="580.95.05"):
    return {"found": True, "ok": True, "error": None, "driver_version": driver,
            "cuda_version": cuda, "path": "/usr/bin/nvidia-smi",
            "gpus": [{"index": i, "name": n, "memory_mib": 24000, "compute_capability": cc}
                     for i, (n, cc) in enumerate(gpus)]}


RTX4090 = ("NVIDIA GeForce RTX 4090", "8.9")
RTX5090 = ("NVIDIA GeForce RTX 5090", "12.0")


@pytest.mark.parametrize("cuda,flavour", [("13.0", "cu130"), ("13.1", "cu130"), (None, "cu130"),
                                          ("12.6", "cu126"), ("12.9", "cu126")])
def test_cuda_flavour_follows_driver_cuda(cuda, flavour):
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda=cuda)))
    assert s.flavour == flavour
    assert s.torch_index_url == f"{spec.PYTORCH_INDEX}/{flavour}"
    assert s.torch.requirement == f"torch==2.13.0+{flavour}"


def test_cu126_warns_to_update_the_driver():
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda="12.8", driver="570.172.08")))
    assert any("580" in w and "570.172.08" in w for w in s.warnings)


def test_unknown_cuda_version_is_noted():
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda=None)))
    assert any("unknown" in n for n in s.notes)


@pytest.mark.parametrize("cuda", ["12.5", "12.2", "11.8"])
def test_old_driver_is_refused(cuda):
    with pytest.raises(spec.SpecRefused, match=f"CUDA {cuda}") as refused:
        spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda=cuda)))
    assert "580" in refused.value.message and "--cpu" in refused.value.hint


@pytest.mark.parametrize("cc", ["12.0", "12.1", "10.0"])
def test_blackwell_on_cuda12_driver_is_refused_naming_580(cc):
    with pytest.raises(spec.SpecRefused, match="580 or newer"):
        spec.make_spec(machine(nvidia=nvidia(("GPU", cc), cuda="12.8")))


def test_hopper_on_cuda12_driver_is_not_blackwell():
    assert spec.make_spec(machine(nvidia=nvidia(("NVIDIA H100", "9.0"), cuda="12.8"))).flavour \
        == "cu126"


def test_pre_turing_alone_gets_cu126_and_mixed_gets_a_warning():
    pascal = ("NVIDIA GeForce GTX 1080 Ti", "6.1")
    assert spec.make_spec(machine(nvidia=nvidia(pascal))).flavour == "cu126"
    mixed = spec.make_spec(machine(nvidia=nvidia(RTX4090, pascal)))
    assert mixed.flavour == "cu130" and any("1080 Ti" in w for w in mixed.warnings)


@pytest.mark.parametrize("name", ["NVIDIA GB10", "NVIDIA GH200 480GB", "NVIDIA GB200"])
def test_grace_gets_dgx_spec(name):
    d = machine(arch="aarch64", nvidia=nvidia((name, "12.1")),
                dgx={"is_dgx": True, "platform": name.split()[1]})
    s = spec.make_spec(d)
    assert (s.backend, s.flavour, s.requirements_file) == ("dgx", "cu130", "dgx_requirements.txt")


def test_grace_with_cuda12_driver_is_refused():
    d = machine(arch="aarch64", nvidia=nvidia(("NVIDIA GH200 480GB", "9.0"), cuda="12.8"),
                dgx={"is_dgx": True, "platform": "GH200"})
    with pytest.raises(spec.SpecRefused, match="580"):
        spec.make_spec(d)


def test_rocm_is_experimental_rocm71():
    d = machine(rocm={"found": True, "ok": True, "version": "7.1.0",
                      "gpus": [{"gfx": "gfx942", "name": "AMD Instinct MI300X"}]})
    s = spec.make_spec(d)
    assert (s.backend, s.flavour, s.experimental) == ("rocm", "rocm7.1", True)
    assert s.torch.requirement == "torch==2.13.0+rocm7.1"
    assert any("experimental" in n for n in s.notes)


def test_rocm_runtime_that_did_not_answer_is_not_rocm():
    d = machine(rocm={"found": True, "ok": False, "error": "rocminfo exited with code 1",
                      "gpus": []})
    with pytest.raises(spec.SpecRefused, match="--cpu"):
        spec.make_spec(d)


def test_macos_arm64_uses_pypi():
    s = spec.make_spec(machine("darwin", "arm64", os_release="14.5",
                               apple={"silicon": True, "chip": "Apple M3", "mps": True}))
    assert (s.backend, s.flavour, s.torch_index_url, s.torch.local) == ("mps", "pypi", None, None)
    assert s.torch.requirement == "torch==2.13.0"
    assert all(c.local is None for c in s.companions)


def test_macos_older_than_14_is_refused():
    with pytest.raises(spec.SpecRefused, match="macOS 14"):
        spec.make_spec(machine("darwin", "arm64", os_release="13.6"))


@pytest.mark.parametrize("cpu", [False, True])
def test_intel_mac_is_refused_even_with_cpu(cpu):
    with pytest.raises(spec.SpecRefused, match="Intel Mac"):
        spec.make_spec(machine("darwin", "x86_64", apple={"silicon": False}), cpu=cpu)


def test_cpu_needs_the_flag():
    with pytest.raises(spec.SpecRefused, match="--cpu") as refused:
        spec.make_spec(machine())
    assert "--cpu" in refused.value.hint
    s = spec.make_spec(machine(), cpu=True)
    assert (s.backend, s.flavour, s.torch.requirement) == ("cpu", "cpu", "torch==2.13.0+cpu")
    assert s.torch_index_url == "https://download.pytorch.org/whl/cpu"


def test_cpu_flag_does_not_override_a_usable_gpu():
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090)), cpu=True)
    assert s.flavour == "cu130" and any("--cpu ignored" in w for w in s.warnings)


def test_refused_gpu_falls_back_to_cpu_only_with_the_flag():
    d = machine(nvidia=nvidia(RTX5090, cuda="12.8"))
    with pytest.raises(spec.SpecRefused):
        spec.make_spec(d)
    s = spec.make_spec(d, cpu=True)
    assert s.backend == "cpu" and any("580" in w for w in s.warnings)


@pytest.mark.parametrize("python", ["3.9.18", "3.15.0", "garbage"])
def test_python_outside_torch_wheels_is_refused(python):
    with pytest.raises(spec.SpecRefused, match="Python"):
        spec.make_spec(machine(python=python), cpu=True)


def test_platform_without_torch_wheels_is_refused():
    with pytest.raises(spec.SpecRefused, match="windows/aarch64"):
        spec.make_spec(machine("windows", "aarch64"), cpu=True)


def test_pins_and_companions():
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090)))
    assert s.torch == spec.Wheel("torch", "2.13.0", "cu130", True, "torch")
    assert [(c.name, c.version, c.local, c.required) for c in s.companions] == [
        ("torchvision", "0.28.0", "cu130", False), ("torchaudio", "2.11.0", "cu130", False)]
    assert s.python == ">=3.10,<3.15"


def _optional(s: spec.Spec, name: str) -> spec.Optional_:
    return next(o for o in (*s.extras, *s.accelerators) if o.name == name)


@pytest.mark.parametrize("d,cpu,available,index", [
    (machine(nvidia=nvidia(RTX4090)), False, True, "https://download.pytorch.org/whl/cu130"),
    (machine(), True, True, "https://download.pytorch.org/whl/cpu"),
    (machine("darwin", "arm64", os_release="15.0"), False, True, None),
    (machine("windows", "x86_64", nvidia=nvidia(RTX4090)), False, True, None),
    (machine(nvidia=nvidia(RTX4090, cuda="12.6")), False, False, None),
    (machine(rocm={"ok": True, "gpus": [{"gfx": "gfx942"}]}), False, False, None),
])
def test_torchcodec_only_where_wheels_exist(d, cpu, available, index):
    codec = _optional(spec.make_spec(d, cpu=cpu), "torchcodec")
    assert codec.kind == "extra" and codec.requirement == "torchcodec==0.13.0"
    assert codec.available is available
    assert codec.index_url == index
    assert codec.available or codec.reason
    # It loads FFmpeg's libraries: the sync skips it (with why) while FFmpeg is missing.
    assert codec.needs == ("ffmpeg",) or not codec.available


def test_a_spec_file_keeps_what_an_optional_package_needs(tmp_path):
    from manager.specsource import spec_from_file

    made = spec.make_spec(machine(), cpu=True)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(made.to_dict()))
    assert _optional(spec_from_file(path), "torchcodec").needs == ("ffmpeg",)


def test_triton_per_platform():
    linux = spec.make_spec(machine(nvidia=nvidia(RTX4090)))
    assert _optional(linux, "triton").available
    assert _optional(linux, "triton").requirement == "triton==3.7.1"
    windows = spec.make_spec(machine("windows", "x86_64", nvidia=nvidia(RTX4090)))
    assert _optional(windows, "triton-windows").requirement == "triton-windows==3.7.1.post27"
    for other in (spec.make_spec(machine(), cpu=True),
                  spec.make_spec(machine("darwin", "arm64", os_release="15.0"))):
        assert not _optional(other, "triton").available and _optional(other, "triton").reason


def test_source_only_accelerators_are_unavailable_with_a_reason():
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090)))
    for name in ("flash-attn", "natten"):
        item = _optional(s, name)
        assert item.kind == "accelerator" and not item.available and "source" in item.reason


def test_a_pinned_accelerator_wheel_is_offered(monkeypatch):
    url = "https://example.invalid/flash_attn-2.8.3-cp311-linux_x86_64.whl"
    monkeypatch.setitem(spec.FLASH_ATTN_WHEELS, ("cu130", "linux", "x86_64", "cp311"), url)
    item = _optional(spec.make_spec(machine(nvidia=nvidia(RTX4090))), "flash-attn")
    assert item.available and item.requirement == url
    other_python = spec.make_spec(machine(python="3.12.1", nvidia=nvidia(RTX4090)))
    assert not _optional(other_python, "flash-attn").available


def test_fingerprint_tracks_installs_not_prose():
    a = spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda="13.0")))
    b = spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda=None)))  # extra note only
    c = spec.make_spec(machine(nvidia=nvidia(RTX4090, cuda="12.6")))
    assert a.notes != b.notes and a.install_fingerprint() == b.install_fingerprint()
    assert a.install_fingerprint() != c.install_fingerprint()


def test_fingerprint_tracks_optional_pins(monkeypatch):
    before = spec.make_spec(machine(nvidia=nvidia(RTX4090))).install_fingerprint()
    monkeypatch.setattr(spec, "TORCHCODEC_VERSION", "0.14.0")
    assert spec.make_spec(machine(nvidia=nvidia(RTX4090))).install_fingerprint() != before


def test_spec_is_json_serialisable_and_summarises_detection():
    s = spec.make_spec(machine(nvidia=nvidia(RTX4090)))
    data = json.loads(json.dumps(s.to_dict()))
    assert data["detection_summary"]["nvidia_gpus"] == ["NVIDIA GeForce RTX 4090"]


def test_spec_py_is_stdlib_only():
    """spec.py must import from a bare Python: nothing outside the standard library."""
    import ast

    tree = ast.parse((ROOT / "spec.py").read_text())
    imported = {(n.module or "").split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom)}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
