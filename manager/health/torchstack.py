"""Spec, torch and its companions in the venv, and the GPU as torch sees it at run time.

The venv's Python runs venv_probe.py (a subprocess with a timeout): the manager never
imports torch, and a wheel that crashes on import cannot take doctor down with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from manager import process
from manager.health import venv_probe
from manager.health.check import (
    FIX_INSTALL,
    FIX_REPAIR,
    FIX_REPORT,
    FIX_SYNC,
    Check,
    Probe,
    fail,
    ok,
    warn,
)
from manager.paths import Paths

IDS = ("spec", "torch", "torchvision", "torchaudio", "gpu")
IMPORT_TIMEOUT = 120.0  # a cold torch import from a slow disk takes a while
GPU_BACKENDS = ("cuda", "dgx", "rocm")
FIX_DRIVER = "make sure the driver sees the GPU (nvidia-smi / rocm-smi), then rerun doctor"


@dataclass(frozen=True)
class Pin:
    name: str
    version: str  # exact, local tag included ("2.13.0+cpu"); a bare one matches any tag
    required: bool


@dataclass(frozen=True)
class Expected:
    """What the spec asks for (None fields: the spec could not be computed)."""

    backend: str | None
    pins: tuple[Pin, ...]
    gpu_detected: bool = False


# ---- pure judgements -------------------------------------------------------------------

def version_matches(installed: str | None, pinned: str) -> bool:
    if not installed:
        return False
    try:
        have, want = Version(installed), Version(pinned)
    except InvalidVersion:
        return installed == pinned
    if want.local is None:  # a PyPI pin: any local build of that version
        return have.public == want.public
    return have == want


def build_kind(runtime: Mapping[str, Any]) -> str:
    if runtime.get("hip"):
        return f"ROCm {runtime['hip']}"
    if runtime.get("cuda"):
        return f"CUDA {runtime['cuda']}"
    return "CPU/MPS" if runtime.get("mps_available") else "CPU"


def backend_matches(backend: str, runtime: Mapping[str, Any]) -> bool:
    if backend in ("cuda", "dgx"):
        return bool(runtime.get("cuda"))
    if backend == "rocm":
        return bool(runtime.get("hip"))
    return not runtime.get("cuda") and not runtime.get("hip")  # cpu, mps


_SM = re.compile(r"^sm_(\d+)(\d)([a-z]?)$")
_PTX = re.compile(r"^compute_(\d+)(\d)([a-z]?)$")


def arch_covers(capability: Sequence[int], arch_list: Sequence[str]) -> bool:
    """Can a device of this compute capability run a build with this arch list?

    CUDA binaries (sm_XY) run on the same major at an equal or higher minor; PTX
    (compute_XY) is JIT-compiled for any equal or newer device. Arch-specific targets
    (sm_90a) run only on their exact capability.
    """
    major, minor = int(capability[0]), int(capability[1])
    for arch in arch_list:
        if m := _SM.match(arch):
            a_major, a_minor, special = int(m[1]), int(m[2]), m[3]
            if a_major == major and (a_minor == minor or (not special and a_minor < minor)):
                return True
        elif (m := _PTX.match(arch)) and not m[3]:
            if (int(m[1]), int(m[2])) <= (major, minor):
                return True
    return False


def _gfx(device: Mapping[str, Any]) -> str | None:
    arch = device.get("gcn_arch")
    return arch.split(":")[0] if arch else None


def judge_spec(expected: Expected | None, error: str | None, refused: bool,
               installed: bool = True) -> Check:
    if expected is None:
        if refused and not installed:
            # No install has recorded a --cpu choice yet, and doctor takes no --cpu.
            return fail("spec", f"no supported environment for this machine: {error}",
                        "without a supported GPU: ./install.sh --cpu; otherwise follow the "
                        "message (`python3 -m manager spec` explains the choice)")
        if refused:
            return fail("spec", f"no supported environment for this machine: {error}",
                        "follow the message; `python3 -m manager spec` explains the choice")
        return warn("spec", f"could not check: {error}", FIX_REPORT)
    pins = ", ".join(f"{p.name} {p.version}" for p in expected.pins)
    return ok("spec", f"backend {expected.backend}: {pins}")


def judge_stack(expected: Expected | None, report: Mapping[str, Any] | None,
                venv_error: str | None,
                recorded: Mapping[str, Mapping[str, Any]] | None = None) -> list[Check]:
    """torch, torchvision, torchaudio and gpu from the venv's report; `recorded` is the
    state's companion outcomes (name -> {status, version, detail}) of the last sync."""
    ids = ("torch", "torchvision", "torchaudio", "gpu")
    if report is None:
        if venv_error is None:  # no venv: the venv check carries the fix
            return [warn(i, "skipped: no venv", FIX_INSTALL) for i in ids]
        return [fail(i, venv_error, FIX_REPAIR) for i in ids]
    packages = report.get("packages", {})
    pins = {p.name: p for p in expected.pins} if expected else {}
    torch_ok = bool(packages.get("torch", {}).get("ok"))
    checks = [_judge_package(name, packages.get(name, {}), pins.get(name), report,
                             (recorded or {}).get(name), torch_ok)
              for name in ("torch", "torchvision", "torchaudio")]
    gpu = _judge_gpu(expected, packages.get("torch", {}), report.get("runtime") or {})
    if not torch_ok and not _importable_but_broken(packages.get("torch", {}), "torch"):
        gpu = warn("gpu", gpu.detail, FIX_INSTALL)  # nothing to repair: install first
    checks.append(gpu)
    return checks


# What the last sync recorded for a companion it could not keep; sync skips it again.
GIVEN_UP = ("install_failed", "removed")


def _importable_but_broken(found: Mapping[str, Any], name: str) -> bool:
    why = str(found.get("error", ""))
    return bool(why) and not why.startswith(f"ModuleNotFoundError: No module named '{name}'")


def _judge_package(name: str, found: Mapping[str, Any], pin: Pin | None,
                   report: Mapping[str, Any], recorded: Mapping[str, Any] | None = None,
                   torch_ok: bool = True) -> Check:
    required = pin.required if pin else name == "torch"
    bad = fail if required else warn
    if not found.get("ok"):
        why = found.get("error", "not reported")
        if (pin is not None and recorded is not None and not required
                and recorded.get("status") in GIVEN_UP
                and recorded.get("version") == pin.version):
            return _given_up(name, pin, recorded)
        if why.startswith(f"ModuleNotFoundError: No module named '{name}'"):
            fix = FIX_INSTALL if required or not torch_ok else FIX_SYNC
            return bad(name, f"{name} is not installed", fix)
        return bad(name, f"{name} does not import: {why}", FIX_REPAIR)
    version = found.get("version")
    runtime = report.get("runtime") or {}
    build = f" ({build_kind(runtime)} build)" if name == "torch" and "error" not in runtime else ""
    if pin is None:
        return ok(name, f"{name} {version}{build}; no pin to compare (see spec)")
    if not version_matches(version, pin.version):
        return bad(name, f"{name} {version} installed; the spec pins {pin.version}", FIX_REPAIR)
    return ok(name, f"{name} {version}{build}, as pinned")


def _given_up(name: str, pin: Pin, recorded: Mapping[str, Any]) -> Check:
    """A companion the last sync could not install (or removed because it did not import).
    A plain sync skips it again and a forced one fails the same way, so the fix is a
    source that has the build."""
    why = str(recorded.get("detail") or "no reason recorded")
    if recorded.get("status") == "removed":
        what = f"{name} {pin.version} was removed by the last sync: it does not import ({why})"
    else:
        what = f"{name} {pin.version} could not be installed by the last sync ({why})"
    return warn(name, what,
                f"optional: the trainer does not need it; to get it, point "
                f"AITK_TORCH_INDEX_URL at an index that has {name}=={pin.version}, then run "
                f"{FIX_SYNC}")


def _judge_gpu(expected: Expected | None, torch_found: Mapping[str, Any],
               runtime: Mapping[str, Any]) -> Check:
    if not torch_found.get("ok"):
        return warn("gpu", "skipped: torch does not import", FIX_REPAIR)
    if "error" in runtime:
        return fail("gpu", f"torch failed to report its devices: {runtime['error']}", FIX_DRIVER)
    backend = expected.backend if expected else None
    if backend and not backend_matches(backend, runtime):
        return fail("gpu", f"the spec wants a {backend} build but torch is a "
                           f"{build_kind(runtime)} build", FIX_REPAIR)
    if backend in GPU_BACKENDS or (backend is None and runtime.get("gpu_available")):
        return _judge_devices(runtime)
    if backend == "mps":
        if not runtime.get("mps_available"):
            return fail("gpu", "torch cannot use the Apple GPU (MPS unavailable)",
                        "update macOS to 12.3+ on Apple silicon, then "
                        "`python3 -m manager sync --verify`")
        return ok("gpu", "Apple GPU (MPS) available to torch")
    if expected and expected.gpu_detected:
        return warn("gpu", "a GPU was detected, but the CPU build is installed",
                    "python3 -m manager install  (without --cpu)")
    return ok("gpu", "CPU build: no GPU expected")


def _judge_devices(runtime: Mapping[str, Any]) -> Check:
    if not runtime.get("gpu_available"):
        return fail("gpu", f"torch ({build_kind(runtime)} build) sees no GPU", FIX_DRIVER)
    arch_list = runtime.get("arch_list") or []
    shown = []
    for device in runtime.get("devices", []):
        gfx = _gfx(device)
        capability = device.get("capability") or [0, 0]
        label = gfx or "sm_{}{}".format(*capability)
        covered = (gfx in arch_list) if gfx else arch_covers(capability, arch_list)
        if not covered:
            return fail("gpu", f"{device.get('name')} ({label}) is not in torch's arch list "
                               f"({' '.join(arch_list) or 'empty'})", FIX_REPAIR)
        shown.append(f"{device.get('name')} ({label})")
    seen = "torch sees " + ", ".join(shown or ["a GPU"])
    if len(shown) < 2 or runtime.get("hip"):
        return ok("gpu", seen)
    if not runtime.get("nccl"):
        return warn("gpu", f"{seen}; NCCL is missing, so training on several GPUs "
                           f"(--gpus {len(shown)}) will not start", FIX_REPAIR)
    return ok("gpu", f"{seen}; NCCL available: train on all with --gpus {len(shown)}")


# ---- gathering ---------------------------------------------------------------------------

def gather_expected(paths: Paths) -> tuple[Expected | None, str | None, bool]:
    """(expected, error, refused): the spec for this machine with the install's --cpu."""
    from manager import detect
    from manager.state import load_state

    try:
        cpu = load_state(paths).cpu_requested
    except Exception:  # noqa: BLE001 - the state check explains a bad state file
        cpu = False
    try:
        import spec as spec_module

        detection = detect.probe().to_dict()
        spec = spec_module.make_spec(detection, cpu=cpu)
    except Exception as exc:  # noqa: BLE001
        refused = type(exc).__name__ in ("SpecRefused", "UnsupportedMachine")
        return None, _short(exc), refused
    pins = (Pin(spec.torch.name, spec.torch.pinned, spec.torch.required),
            *(Pin(c.name, c.pinned, c.required) for c in spec.companions))
    gpus = bool((detection.get("nvidia") or {}).get("gpus") or
                (detection.get("rocm") or {}).get("gpus"))
    return Expected(spec.backend, tuple(pins), gpus), None, False


def _short(exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError):
        return "not implemented in this version"
    lines = str(exc).strip().splitlines()
    return f"{lines[0]}" if lines else type(exc).__name__


def gather_report(paths: Paths) -> tuple[dict | None, str | None]:
    """(report, error) from the venv's Python; (None, None) when there is no venv."""
    python = paths.venv_python
    if not python.exists():
        return None, None
    script = Path(venv_probe.__file__)
    done = process.run([python, "-I", script], cwd=paths.root,
                       timeout=IMPORT_TIMEOUT)
    if done.timed_out:
        raise TimeoutError(f"importing the torch stack took over {IMPORT_TIMEOUT:g}s")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(venv_probe.MARKER):
            return json.loads(line[len(venv_probe.MARKER):]), None
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return None, f"the venv's Python crashed importing the torch stack: {tail}"


def recorded_companions(paths: Paths) -> dict[str, dict[str, Any]]:
    """The last sync's companion outcomes; empty when the state cannot be read (the state
    check reports that)."""
    from manager.state import load_state

    try:
        return dict(load_state(paths).companions)
    except Exception:  # noqa: BLE001 - the state check explains a bad state file
        return {}


def probe_all(paths: Paths) -> list[Check]:
    expected, error, refused = gather_expected(paths)
    report, venv_error = gather_report(paths)
    recorded = recorded_companions(paths)
    return [judge_spec(expected, error, refused, paths.state_file.exists()),
            *judge_stack(expected, report, venv_error, recorded)]


def probes(paths: Paths) -> list[Probe]:
    return [Probe(IDS, lambda: probe_all(paths), IMPORT_TIMEOUT + 15)]
