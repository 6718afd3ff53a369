"""Hardware -> environment spec. Stdlib only and pure: no I/O, no subprocesses.

`make_spec(detection, cpu=...)` takes the plain dict that `manager detect --json`
prints under "data" and returns the Spec the sync engine installs. The pin tables are
at the top of this file: bump versions here and nowhere else.

(Contract skeleton: the rules are filled in by the detection/spec work, issue 2.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# ---- pin tables ----------------------------------------------------------------------
TORCH_VERSION = "2.13.0"
COMPANIONS = {"torchvision": "0.28.0", "torchaudio": "2.11.0"}
PYTORCH_INDEX = "https://download.pytorch.org/whl"  # + "/cu130", "/cpu", "/rocm7.1"


class SpecRefused(Exception):
    """This machine cannot get a supported environment; the message says what to do."""


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
        return asdict(self)

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
                (o.name, o.requirement, o.available) for o in (*self.extras, *self.accelerators)
            ],
        }
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()


def make_spec(detection: Mapping[str, Any], *, cpu: bool = False) -> Spec:
    raise NotImplementedError
