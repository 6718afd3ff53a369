"""Local tools (.uv, .node, .ffmpeg, .mingit): contract stub; issue 5 implements it.

`find_uv` is what the sync engine uses to choose its installer; `child_env` is what
`launch` and the venv's Python get so they see the local tools.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from manager.paths import Paths


def find_uv(paths: Paths) -> Path | None:
    """A uv good enough to use (system or .uv/), or None."""
    local = paths.uv_dir / "uv"
    if local.exists():
        return local
    found = shutil.which("uv")
    return Path(found) if found else None


def child_env(paths: Paths) -> dict[str, str]:
    """Environment additions (PATH, library paths) for processes that use the tools."""
    return {}
