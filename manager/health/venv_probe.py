"""Run by the venv's Python (`python -I venv_probe.py`): report the torch stack.

Stdlib only and self-contained: it runs in the trainer's environment, not the manager's.
It prints one line `AITK_PROBE {json}` last; anything a package prints is ignored.
Each import is guarded, so one broken package is reported, not fatal.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys

MARKER = "AITK_PROBE "
STACK = ("torch", "torchvision", "torchaudio")


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def try_import(name: str) -> dict:
    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - a broken wheel can raise anything
        return {"ok": False, "error": _error(exc)}
    return {"ok": True, "version": getattr(module, "__version__", None)}


def torch_runtime() -> dict:
    """What torch sees at run time: its build, the GPUs, and the archs it was built for."""
    import torch

    out: dict = {
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "hip": getattr(getattr(torch, "version", None), "hip", None),
        "gpu_available": False,
        "devices": [],
        "arch_list": [],
        "mps_available": False,
    }
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        out["gpu_available"] = True
        out["arch_list"] = list(cuda.get_arch_list())
        for index in range(cuda.device_count()):
            props = cuda.get_device_properties(index)
            out["devices"].append({
                "name": cuda.get_device_name(index),
                "capability": list(cuda.get_device_capability(index)),
                "gcn_arch": getattr(props, "gcnArchName", None),
            })
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None:
        out["mps_available"] = bool(mps.is_available())
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available():  # multi-GPU training (run.py --gpus)
        out["nccl"] = bool(dist.is_nccl_available())
    return out


def main() -> dict:
    report: dict = {"python": platform.python_version(), "packages": {}}
    for name in STACK:  # torch first: the companions import it
        report["packages"][name] = try_import(name)
    if report["packages"]["torch"]["ok"]:
        try:
            report["runtime"] = torch_runtime()
        except BaseException as exc:  # noqa: BLE001
            report["runtime"] = {"error": _error(exc)}
    return report


if __name__ == "__main__":
    result = main()
    sys.stdout.write("\n" + MARKER + json.dumps(result) + "\n")
