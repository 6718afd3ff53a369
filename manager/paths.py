"""Where things live inside the checkout. Everything the manager provisions is here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Paths:
    root: Path = ROOT

    @property
    def venv(self) -> Path:
        return self.root / ".venv"

    @property
    def venv_python(self) -> Path:
        if os.name == "nt":
            return self.venv / "Scripts" / "python.exe"
        return self.venv / "bin" / "python"

    @property
    def state_file(self) -> Path:
        return self.venv / "aitk_manager_state.json"

    @property
    def lock_file(self) -> Path:
        # Beside .venv, not in it: a venv rebuild must not drop the lock.
        return self.root / ".aitk.lock"

    @property
    def uv_dir(self) -> Path:
        return self.root / ".uv"

    @property
    def node_dir(self) -> Path:
        return self.root / ".node"

    @property
    def ffmpeg_dir(self) -> Path:
        return self.root / ".ffmpeg"

    @property
    def mingit_dir(self) -> Path:
        return self.root / ".mingit"


def paths() -> Paths:
    """The checkout's paths; AITK_ROOT points tests at a temporary copy."""
    root = os.environ.get("AITK_ROOT")
    return Paths(Path(root).resolve()) if root else Paths()
