"""Local tools (.uv, .node, .ffmpeg, .mingit): contract stub; issue 5 implements it.

`find_uv` is what the sync engine uses to choose its installer; `child_env` is what
`launch` and the venv's Python get so they see the local tools.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def ensure_uv(paths: Paths) -> Path | None:
    """A usable uv, provisioning .uv/ when needed; None when none can be had (use pip)."""
    return find_uv(paths)


def provision_all(paths: Paths, report: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Provision every missing tool this platform needs. Never raises for one tool's
    failure: each outcome ({"status": "ok"|"system"|"failed"|"skipped", "version",
    "path", "detail"}) is returned for the state's `tools` record."""
    return {}


def report_tools(paths: Paths) -> list[dict[str, Any]]:
    """For `manager tools` and `doctor`: name, used ("system"|"local"|None), version,
    path, minimum, ok."""
    return []
