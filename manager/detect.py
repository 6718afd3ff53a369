"""Hardware detection: probe this machine -> Detection (plain data).

(Contract stub; issue 2 fills it in: pure parsers over captured nvidia-smi / rocm-smi
text, and a thin `probe` that runs them. `probe` never raises.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class NvidiaGpu:
    index: int
    name: str
    memory_mib: int | None  # None where the driver prints [N/A] (unified memory, GB10)
    compute_capability: str | None  # "12.0"; None where [N/A]


@dataclass(frozen=True)
class Detection:
    os: str  # "linux" | "darwin" | "windows"
    arch: str  # "x86_64" | "aarch64" | "arm64" (macOS keeps arm64)
    python: str  # "3.11.7"
    wsl: bool = False
    nvidia: dict[str, Any] = field(default_factory=dict)
    rocm: dict[str, Any] = field(default_factory=dict)
    apple: dict[str, Any] = field(default_factory=dict)
    dgx: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe() -> Detection:
    raise NotImplementedError
