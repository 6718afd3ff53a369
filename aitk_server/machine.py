"""The header's live monitor: per GPU its memory, utilisation and temperature, from
whichever tool the machine has (nvidia-smi, rocm-smi; torch's view only when a trainer
module already imported it, since the server never loads torch itself), and the CPU
and RAM always (/proc on Linux, the load average elsewhere).

The parsers are pure and take the tools' captured output (tests feed them fixtures);
`snapshot()` runs the tools with a short timeout and caches the answer for a second,
so many open pages cost one probe.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

TIMEOUT_S = 3.0
CACHE_S = 1.0
NVIDIA_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total,"
                "utilization.gpu,temperature.gpu", "--format=csv,noheader,nounits"]
ROCM_QUERY = ["rocm-smi", "--showmeminfo", "vram", "--showuse", "--showtemp", "--json"]
MIB = 1024 * 1024


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_nvidia(text: str) -> list[dict[str, Any]]:
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6:
            continue
        used, total = _number(cells[2]), _number(cells[3])
        gpus.append({"index": int(_number(cells[0]) or 0), "name": cells[1],
                     "memory_used_bytes": int(used * MIB) if used is not None else None,
                     "memory_total_bytes": int(total * MIB) if total is not None else None,
                     "utilization_pct": _number(cells[4]),
                     "temperature_c": _number(cells[5])})
    return gpus


def parse_rocm(text: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except ValueError:
        return []
    gpus = []
    for key, card in sorted(data.items()) if isinstance(data, dict) else []:
        if not key.startswith("card") or not isinstance(card, dict):
            continue
        def find(*words: str, card: dict[str, Any] = card) -> float | None:
            for name, value in card.items():
                if all(w in name.lower() for w in words):
                    return _number(str(value))
            return None
        used, total = find("vram", "used"), find("vram", "total memory")
        gpus.append({"index": int(key[4:]) if key[4:].isdigit() else len(gpus),
                     "name": str(card.get("Card series") or card.get("Card SKU") or key),
                     "memory_used_bytes": int(used) if used is not None else None,
                     "memory_total_bytes": int(total) if total is not None else None,
                     "utilization_pct": find("gpu use"),
                     "temperature_c": find("temperature", "edge") or find("temperature")})
    return gpus


def parse_meminfo(text: str) -> dict[str, int]:
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name] = int(parts[0]) * 1024
    total = values.get("MemTotal", 0)
    return {"ram_total_bytes": total,
            "ram_used_bytes": total - values.get("MemAvailable", values.get("MemFree", 0))}


def cpu_busy(before: list[int], after: list[int]) -> float | None:
    """The busy share (0-100) between two `cpu` lines of /proc/stat."""
    if len(before) < 5 or len(after) < 5:
        return None
    idle = (after[3] + after[4]) - (before[3] + before[4])  # idle + iowait
    total = sum(after) - sum(before)
    return round(100.0 * (total - idle) / total, 1) if total > 0 else None


def _cpu_times() -> list[int]:
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            return [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _torch_gpus() -> list[dict[str, Any]]:
    torch = sys.modules.get("torch")  # never imported here: only if already loaded
    if torch is None or not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        out.append({"index": i, "name": torch.cuda.get_device_name(i),
                    "memory_used_bytes": total - free, "memory_total_bytes": total,
                    "utilization_pct": None, "temperature_c": None})
    return out


class Machine:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = 0.0
        self._last: dict[str, Any] = {}
        self._cpu = _cpu_times()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            if time.monotonic() - self._at < CACHE_S:
                return self._last
            gpus, source = [], None
            for name, argv, parse in (("nvidia-smi", NVIDIA_QUERY, parse_nvidia),
                                      ("rocm-smi", ROCM_QUERY, parse_rocm)):
                text = _run(argv)
                if text is not None and (found := parse(text)):
                    gpus, source = found, name
                    break
            if not gpus and (found := _torch_gpus()):
                gpus, source = found, "torch"
            now = _cpu_times()
            busy, self._cpu = cpu_busy(self._cpu, now), now
            try:
                with open("/proc/meminfo", encoding="ascii") as fh:
                    ram = parse_meminfo(fh.read())
            except OSError:
                ram = {"ram_total_bytes": None, "ram_used_bytes": None}
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            self._last = {"gpus": gpus, "gpu_source": source, "cpu_pct": busy,
                          "cpu_count": os.cpu_count(), "load": load, **ram}
            self._at = time.monotonic()
            return self._last
