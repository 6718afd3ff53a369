"""`manager info`: what this checkout is and runs: toolkit version, git commit, branch,
dirty files, remote (credentials redacted), the installed versions of the libraries that
shape trained weights, the backend and the registered archs.

The block comes from `aitk.run.provenance` (stdlib only, no torch), the same one training
outputs record in their metadata (`aitk_info`), so a LoRA can be traced to this output.
The backend is the manager's own record (its state file) when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from manager.output import Result, render_mapping
from manager.paths import paths
from manager.state import read_state


def run() -> Result:
    from aitk.run import provenance  # light: stdlib only

    data: dict[str, Any] = dict(provenance.collect())
    recorded = read_state(paths(), keep_backup=False)
    data["backend"] = recorded.state.backend or data.get("torch_build") or "not installed"
    messages = (f"state file not used: {recorded.problem}",) if recorded.problem else ()
    return Result(data=data, messages=messages)


def render(console: Console, data: Mapping[str, Any]) -> None:
    shown = dict(data)
    shown["commit"] = data.get("commit") or "unknown (not a git checkout, or git is missing)"
    shown["branch"] = data.get("branch") or "(detached or unknown)"
    shown["dirty_files"] = ", ".join(data.get("dirty_files") or []) or "none"
    shown["remote"] = data.get("remote") or "none"
    shown["packages"] = ", ".join(f"{k} {v or 'not installed'}"
                                  for k, v in (data.get("packages") or {}).items())
    shown["archs"] = ", ".join(data.get("archs") or []) or "none"
    render_mapping(console, shown)
