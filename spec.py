"""Hardware -> environment spec. Stdlib only and pure: no I/O, no subprocesses.

`make_spec(detection, cpu=...)` takes the plain dict that `manager detect --json`
prints under "data" and returns the Spec the sync engine installs, or raises
SpecRefused with a message that says what to do. The pin tables are at the top of this
file: bump versions here and nowhere else.

The rules, in order:
    Python outside the torch wheels' range        -> refused
    NVIDIA GPU on a Grace system (GB10, GH200...) -> "dgx": cu130 + dgx_requirements.txt
    NVIDIA GPU (driver answers)                   -> cu130 (driver CUDA >= 13.0 or unknown)
                                                     cu126 (12.6 - 12.9, warning), except
                                                     Blackwell there: refused (driver 580+)
                                                     older driver: refused
    AMD GPU with a ROCm runtime that answers      -> rocm7.1, experimental
    macOS on Apple silicon                        -> PyPI wheels (MPS)
    nothing usable                                -> the CPU build with cpu=True, else refused
A GPU that is refused (old driver, failing nvidia-smi) falls back to the CPU build only
when cpu=True, with the reason kept as a warning.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# ---- pin tables ----------------------------------------------------------------------
TORCH_VERSION = "2.13.0"
COMPANIONS = {"torchvision": "0.28.0", "torchaudio": "2.11.0"}
PYTORCH_INDEX = "https://download.pytorch.org/whl"  # + "/cu130", "/cpu", "/rocm7.1"
# torch 2.13.0 publishes cp310 ... cp314 wheels, for these platforms only (no Intel Mac,
# no Windows on Arm).
TORCH_PYTHONS = ((3, 10), (3, 14))
TORCH_PLATFORMS = {("linux", "x86_64"), ("linux", "aarch64"), ("darwin", "arm64"),
                   ("windows", "x86_64")}
MACOS_MIN = (14, 0)  # the macOS wheels are tagged macosx_14_0_arm64

# CUDA wheel flavours, newest first: (flavour, lowest driver CUDA version, driver branch
# that brings it on Linux).
CUDA_FLAVOURS = (("cu130", (13, 0), "580"), ("cu126", (12, 6), "560"))
# cu126 builds stop at Hopper (sm_90); Blackwell (10.0 B200, 12.0 RTX 50, 12.1 GB10)
# needs CUDA 12.8+, which here means cu130.
BLACKWELL_CC = (10, 0)
# CUDA 13 dropped Maxwell, Pascal and Volta: cu130 builds start at Turing (sm_75).
CU130_MIN_CC = (7, 5)
ROCM_FLAVOUR = "rocm7.1"

# Platform extras and optional accelerators. Each is offered only where a prebuilt
# wheel exists for the platform, Python and flavour; elsewhere it is listed as
# unavailable with the reason.
TORCHCODEC_VERSION = "0.13.0"  # torchcodec 0.12+ supports torch >= 2.11
TORCHCODEC_PLATFORMS = {("linux", "x86_64"), ("linux", "aarch64"), ("darwin", "arm64"),
                        ("windows", "x86_64")}
TRITON_VERSION = "3.7.1"  # what torch 2.13.0's Linux wheels require themselves
TRITON_WINDOWS_VERSION = "3.7.1.post27"  # the triton-windows build of the same release
# flash-attn and NATTEN ship only sources on PyPI (a build needs the CUDA toolkit and
# hours). A maintainer adds a verified prebuilt wheel URL here, keyed by
# (flavour, os, arch, "cp311"), once one exists for torch 2.13.0.
FLASH_ATTN_WHEELS: dict[tuple[str, str, str, str], str] = {}
NATTEN_WHEELS: dict[tuple[str, str, str, str], str] = {}
# ---------------------------------------------------------------------------------------


class SpecRefused(Exception):
    """This machine cannot get a supported environment; the message says what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Wheel:
    """One exactly pinned package from the PyTorch source."""

    name: str
    version: str
    local: str | None = None  # PEP 440 local tag: "cu130", "cpu", "rocm7.1"; None on PyPI
    required: bool = True  # torch is required; companions are not needed by the trainer
    import_name: str = ""

    @property
    def pinned(self) -> str:
        """The exact version, local tag included: '2.13.0+cpu'."""
        return f"{self.version}+{self.local}" if self.local else self.version

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.pinned}"


@dataclass(frozen=True)
class Optional_:
    """A platform extra or accelerator: installed, import-tested, rolled back on failure."""

    name: str
    requirement: str  # a PEP 508 requirement or a direct wheel URL
    import_name: str
    kind: str = "accelerator"  # "extra" (torchcodec) or "accelerator" (flash-attn, ...)
    available: bool = True  # False: no prebuilt wheel for this platform/Python/flavour
    reason: str = ""  # why it is unavailable
    index_url: str | None = None  # where to find it; None: the default index (PyPI)
    needs: tuple[str, ...] = ()  # local tools it cannot work without (manager/tools)


@dataclass(frozen=True)
class Spec:
    backend: str  # "cuda" | "dgx" | "rocm" | "mps" | "cpu"
    flavour: str  # "cu130" | "cu126" | "rocm7.1" | "cpu" | "pypi"
    torch_index_url: str | None  # None: the default index (PyPI) plus find-links
    torch: Wheel
    companions: tuple[Wheel, ...]
    requirements_file: str  # "requirements.txt" or "dgx_requirements.txt"
    extras: tuple[Optional_, ...] = ()
    accelerators: tuple[Optional_, ...] = ()
    python: str = ">=3.10"
    experimental: bool = False
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    detection_summary: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["detection_summary"] = dict(self.detection_summary)
        return data

    def install_fingerprint(self) -> str:
        """Hash of what changes the installed set; prose (notes, warnings) excluded."""
        relevant = {
            "backend": self.backend,
            "flavour": self.flavour,
            "torch_index_url": self.torch_index_url,
            "torch": asdict(self.torch),
            "companions": [asdict(c) for c in self.companions],
            "requirements_file": self.requirements_file,
            "optional": [
                (o.name, o.requirement, o.available, o.index_url)
                for o in (*self.extras, *self.accelerators)
            ],
        }
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()


# ---- small readers over the detection dict --------------------------------------------


def _version(text: Any) -> tuple[int, ...] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _show(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _gpus(detection: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    nvidia = detection.get("nvidia") or {}
    return list(nvidia.get("gpus") or []) if nvidia.get("ok") else []


def _gpu_label(gpu: Mapping[str, Any]) -> str:
    cc = gpu.get("compute_capability")
    return f"{gpu.get('name', 'GPU')} (compute {cc})" if cc else str(gpu.get("name", "GPU"))


def _summary(d: Mapping[str, Any]) -> dict[str, Any]:
    nvidia = d.get("nvidia") or {}
    rocm = d.get("rocm") or {}
    apple = d.get("apple") or {}
    return {
        "os": d.get("os"),
        "arch": d.get("arch"),
        "python": d.get("python"),
        "wsl": bool(d.get("wsl")),
        "nvidia_gpus": [g.get("name") for g in _gpus(d)],
        "nvidia_driver": nvidia.get("driver_version"),
        "driver_cuda": nvidia.get("cuda_version"),
        "nvidia_error": nvidia.get("error"),
        "rocm_gpus": [g.get("gfx") for g in rocm.get("gpus") or []] if rocm.get("ok") else [],
        "rocm_version": rocm.get("version"),
        "apple_chip": apple.get("chip"),
        "dgx": (d.get("dgx") or {}).get("platform"),
    }


# ---- decisions ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Choice:
    backend: str
    flavour: str
    requirements_file: str = "requirements.txt"
    experimental: bool = False
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _check_platform(os_name: str, arch: str, python: str) -> None:
    if (os_name, arch) not in TORCH_PLATFORMS:
        if os_name == "darwin" and arch == "x86_64":
            raise SpecRefused(
                f"PyTorch {TORCH_VERSION} publishes no wheels for Intel Macs (x86_64)",
                hint="use a Mac with Apple silicon and an arm64 Python, or Linux/Windows")
        raise SpecRefused(f"PyTorch {TORCH_VERSION} publishes no wheels for {os_name}/{arch}",
                          hint="supported: Linux x86_64/aarch64, Windows x86_64, macOS arm64")
    v = _version(python)
    low, high = TORCH_PYTHONS
    if v is None or not low <= v <= high:
        raise SpecRefused(
            f"PyTorch {TORCH_VERSION} has wheels for Python {_show(low)} to {_show(high)}, "
            f"not {python}",
            hint=f"run the manager with a Python between {_show(low)} and {_show(high)}")


def _cuda_choice(d: Mapping[str, Any]) -> _Choice:
    """The CUDA flavour for a working NVIDIA driver; raises SpecRefused."""
    nvidia = d.get("nvidia") or {}
    gpus = _gpus(d)
    driver = nvidia.get("driver_version") or "unknown"
    cuda = _version(nvidia.get("cuda_version"))
    caps = [(g, _version(g.get("compute_capability"))) for g in gpus]
    blackwell = [g for g, cc in caps if cc is not None and cc >= BLACKWELL_CC]
    old = [g for g, cc in caps if cc is not None and cc < CU130_MIN_CC]
    grace = (d.get("dgx") or {}).get("platform")
    notes: list[str] = []
    warnings: list[str] = []
    newest, newest_cuda, newest_driver = CUDA_FLAVOURS[0]
    oldest, oldest_cuda, _ = CUDA_FLAVOURS[-1]
    if cuda is None:
        flavour = newest
        notes.append(f"the driver's CUDA version is unknown; assuming {newest} "
                     f"(needs driver {newest_driver} or newer)")
    elif cuda >= newest_cuda:
        flavour = newest
    elif cuda >= oldest_cuda and not grace:
        if blackwell:
            names = ", ".join(_gpu_label(g) for g in blackwell)
            raise SpecRefused(
                f"{names} needs NVIDIA driver {newest_driver} or newer (CUDA "
                f"{_show(newest_cuda)}); driver {driver} supports CUDA {_show(cuda)}",
                hint=f"install NVIDIA driver {newest_driver} or newer, then run again")
        flavour = oldest
        warnings.append(
            f"driver {driver} supports CUDA {_show(cuda)}: using the {oldest} build; update "
            f"to driver {newest_driver} or newer for {newest}")
    else:
        floor = newest_cuda if grace else oldest_cuda
        raise SpecRefused(
            f"NVIDIA driver {driver} supports CUDA {_show(cuda)}; PyTorch {TORCH_VERSION} "
            f"needs CUDA {_show(floor)} or newer here (driver {newest_driver} or newer "
            f"recommended)",
            hint=f"install NVIDIA driver {newest_driver} or newer, then run again "
                 "(or pass --cpu to use the CPU build)")
    if flavour == newest and old:
        names = ", ".join(_gpu_label(g) for g in old)
        if len(old) == len(caps) and not grace:
            # Every GPU predates Turing: the cu126 build still runs them, on any newer driver.
            flavour = oldest
            notes.append(f"{names}: {newest} builds start at compute {_show(CU130_MIN_CC)}; "
                         f"using {oldest}")
        else:
            warnings.append(f"{names}: not supported by {newest} builds (compute "
                            f"{_show(CU130_MIN_CC)}+); PyTorch will not use it")
    if grace:
        notes.append(f"DGX/Grace ({grace}): {newest} aarch64 wheels and dgx_requirements.txt")
        return _Choice("dgx", newest, "dgx_requirements.txt", notes=tuple(notes),
                       warnings=tuple(warnings))
    if d.get("wsl"):
        notes.append("WSL2: CUDA comes from the Windows NVIDIA driver")
    return _Choice("cuda", flavour, notes=tuple(notes), warnings=tuple(warnings))


def _accelerator_choice(d: Mapping[str, Any]) -> _Choice | None:
    """The GPU backend for this machine, None when there is none; raises SpecRefused."""
    os_name, arch = d.get("os"), d.get("arch")
    nvidia = d.get("nvidia") or {}
    rocm = d.get("rocm") or {}
    apple = d.get("apple") or {}
    if nvidia.get("ok") and _gpus(d):
        return _cuda_choice(d)
    if nvidia.get("found") and nvidia.get("error"):
        raise SpecRefused(f"an NVIDIA driver is installed but does not work: {nvidia['error']}",
                          hint="fix the NVIDIA driver (reboot after an update, check "
                               "`nvidia-smi`), or pass --cpu to use the CPU build")
    if rocm.get("ok") and rocm.get("gpus") and os_name == "linux" and arch == "x86_64":
        gfx = ", ".join(sorted({str(g.get("gfx")) for g in rocm["gpus"]}))
        notes = [f"ROCm is experimental: {ROCM_FLAVOUR} wheels for {gfx}"]
        warnings = []
        version = _version(rocm.get("version"))
        if version is not None and version < (7, 0):
            warnings.append(f"ROCm {rocm.get('version')} found; the {ROCM_FLAVOUR} wheels bring "
                            "their own libraries but need a recent amdgpu kernel driver")
        return _Choice("rocm", ROCM_FLAVOUR, experimental=True, notes=tuple(notes),
                       warnings=tuple(warnings))
    if os_name == "darwin" and arch == "arm64":
        mac = _version(d.get("os_release"))
        if mac is not None and mac < MACOS_MIN:
            raise SpecRefused(f"PyTorch {TORCH_VERSION} needs macOS {_show(MACOS_MIN)} or newer "
                              f"(this is {d.get('os_release')})", hint="update macOS")
        chip = apple.get("chip") or "Apple silicon"
        return _Choice("mps", "pypi", notes=(f"{chip}: PyPI wheels with MPS",))
    return None


def make_spec(detection: Mapping[str, Any], *, cpu: bool = False) -> Spec:
    """The environment for a detected machine; raises SpecRefused when there is none."""
    os_name = str(detection.get("os", ""))
    arch = str(detection.get("arch", ""))
    python = str(detection.get("python", ""))
    if os_name == "darwin" and arch == "x86_64" and (detection.get("apple") or {}).get("rosetta"):
        raise SpecRefused("this Python runs under Rosetta on Apple silicon (x86_64); PyTorch "
                          f"{TORCH_VERSION} has no Intel-Mac wheels",
                          hint="install an arm64 Python (e.g. from python.org) and run again")
    _check_platform(os_name, arch, python)
    try:
        choice = _accelerator_choice(detection)
    except SpecRefused as refused:
        if not cpu:
            raise
        choice = _Choice("cpu", "cpu", warnings=(
            f"GPU not usable ({refused.message}); using the CPU build as --cpu asked",))
    if choice is None:
        if not cpu:
            raise SpecRefused(
                "no supported GPU found (NVIDIA, AMD with ROCm, Apple silicon); run again "
                "with --cpu to use the CPU build of PyTorch (training on a CPU is very slow)",
                hint="pass --cpu to accept the CPU build")
        choice = _Choice("cpu", "cpu", notes=("CPU build (no GPU): training will be slow",))
    elif cpu and choice.backend != "cpu":
        choice = _Choice(choice.backend, choice.flavour, choice.requirements_file,
                         choice.experimental, choice.notes,
                         (*choice.warnings, f"--cpu ignored: a usable GPU was found "
                          f"({choice.backend})"))
    return _build(detection, choice)


def _build(d: Mapping[str, Any], choice: _Choice) -> Spec:
    pypi = choice.flavour == "pypi"
    index = None if pypi else f"{PYTORCH_INDEX}/{choice.flavour}"
    local = None if pypi else choice.flavour
    torch = Wheel("torch", TORCH_VERSION, local, True, "torch")
    companions = tuple(Wheel(name, version, local, False, name)
                       for name, version in COMPANIONS.items())
    low, high = TORCH_PYTHONS
    notes = (f"PyTorch {TORCH_VERSION} from {index or 'PyPI'}", *choice.notes)
    return Spec(
        backend=choice.backend,
        flavour=choice.flavour,
        torch_index_url=index,
        torch=torch,
        companions=companions,
        requirements_file=choice.requirements_file,
        extras=(_torchcodec(d, choice, index),),
        accelerators=_accelerators(d, choice),
        python=f">={_show(low)},<{high[0]}.{high[1] + 1}",
        experimental=choice.experimental,
        notes=notes,
        warnings=choice.warnings,
        detection_summary=_summary(d),
    )


# ---- optional packages ----------------------------------------------------------------


def _python_tag(d: Mapping[str, Any]) -> str:
    v = _version(d.get("python")) or (0, 0)
    return f"cp{v[0]}{v[1]}"


def _torchcodec(d: Mapping[str, Any], choice: _Choice, index: str | None) -> Optional_:
    req = f"torchcodec=={TORCHCODEC_VERSION}"

    def unavailable(reason: str) -> Optional_:
        return Optional_("torchcodec", req, "torchcodec", "extra", False, reason)

    if (d.get("os"), d.get("arch")) not in TORCHCODEC_PLATFORMS:
        return unavailable(f"no torchcodec wheel for {d.get('os')}/{d.get('arch')}")
    if choice.flavour == ROCM_FLAVOUR:
        return unavailable("torchcodec publishes no ROCm build")
    if choice.flavour == "cu126":
        return unavailable(f"no torchcodec {TORCHCODEC_VERSION} build for cu126 is known; "
                           "update the driver to get cu130")
    # torchcodec loads FFmpeg's shared libraries at import: without FFmpeg it cannot work.
    needs = ("ffmpeg",)
    if d.get("os") == "windows" or choice.flavour == "pypi":
        # PyPI carries the Windows (CPU decoding) and macOS arm64 wheels.
        return Optional_("torchcodec", req, "torchcodec", "extra", needs=needs)
    return Optional_("torchcodec", req, "torchcodec", "extra", index_url=index, needs=needs)


def _accelerators(d: Mapping[str, Any], choice: _Choice) -> tuple[Optional_, ...]:
    os_name, arch, tag = str(d.get("os")), str(d.get("arch")), _python_tag(d)
    cuda = choice.backend in ("cuda", "dgx")
    out = []
    for name, import_name, table in (("flash-attn", "flash_attn", FLASH_ATTN_WHEELS),
                                     ("natten", "natten", NATTEN_WHEELS)):
        url = table.get((choice.flavour, os_name, arch, tag))
        if url:
            out.append(Optional_(name, url, import_name))
        elif cuda:
            out.append(Optional_(name, name, import_name, available=False, reason=(
                f"no prebuilt {name} wheel for torch {TORCH_VERSION}+{choice.flavour}, {tag}, "
                f"{os_name}/{arch} (PyPI ships only the source)")))
        else:
            out.append(Optional_(name, name, import_name, available=False,
                                 reason=f"needs an NVIDIA GPU; none for {choice.backend}"))
    if os_name == "windows":
        name, req = "triton-windows", f"triton-windows=={TRITON_WINDOWS_VERSION}"
    else:
        name, req = "triton", f"triton=={TRITON_VERSION}"
    if cuda:
        out.append(Optional_(name, req, "triton"))
    elif choice.backend == "rocm":
        out.append(Optional_(name, req, "triton", available=False,
                             reason="the ROCm torch wheel brings its own pytorch-triton-rocm"))
    else:
        out.append(Optional_(name, req, "triton", available=False,
                             reason=f"Triton needs a CUDA GPU; none for {choice.backend}"))
    return tuple(out)
