"""`manager detect`: what hardware this machine has, and why we think so. Never fails."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from manager import detect
from manager.output import Result


def run() -> Result:
    return Result(data=detect.probe().to_dict())


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def render(console: Console, data: Mapping[str, Any]) -> None:
    system = Table(title="System", show_header=False, box=None, pad_edge=False)
    system.add_column(style="bold")
    system.add_column()
    system.add_row("OS", f"{data.get('os')} {data.get('os_release') or ''}".strip())
    system.add_row("Architecture", str(data.get("arch")))
    system.add_row("Python", str(data.get("python")))
    if data.get("os") == "linux":
        system.add_row("WSL2", _yes(data.get("wsl")))
    dgx = data.get("dgx") or {}
    if dgx.get("is_dgx"):
        system.add_row("DGX/Grace", str(dgx.get("platform")))
    apple = data.get("apple") or {}
    if apple:
        system.add_row("Apple chip", str(apple.get("chip") or "unknown"))
        system.add_row("MPS", _yes(apple.get("mps")))
    console.print(system)

    nvidia = data.get("nvidia") or {}
    if nvidia.get("found"):
        if nvidia.get("ok"):
            gpus = Table(title=f"NVIDIA (driver {nvidia.get('driver_version') or '?'}, "
                               f"CUDA {nvidia.get('cuda_version') or '?'})")
            for col in ("#", "GPU", "Memory", "Compute"):
                gpus.add_column(col)
            for g in nvidia.get("gpus", []):
                mem = f"{g['memory_mib']} MiB" if g.get("memory_mib") is not None else "shared"
                gpus.add_row(str(g.get("index")), str(g.get("name")), mem,
                             str(g.get("compute_capability") or "?"))
            console.print(gpus)
        else:
            console.print(f"NVIDIA: nvidia-smi failed: {nvidia.get('error')}", markup=False)
    rocm = data.get("rocm") or {}
    if rocm.get("ok"):
        table = Table(title=f"AMD ROCm {rocm.get('version') or '(version unknown)'}")
        table.add_column("GPU")
        table.add_column("Target")
        for g in rocm.get("gpus", []):
            table.add_row(str(g.get("name")), str(g.get("gfx")))
        console.print(table)
    elif rocm.get("found"):
        console.print(f"ROCm: {rocm.get('error')}", markup=False)
    if not (nvidia.get("ok") or rocm.get("ok") or apple.get("mps")):
        console.print("No GPU found.")
    for note in data.get("notes") or ():
        console.print(f"note: {note}", markup=False)
