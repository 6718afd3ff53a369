"""uv, node, ffmpeg and git: which copy is used (local in the checkout or the system's)
and its version. manager.tools is the source; a tool it does not report is looked up on
PATH so doctor still says something useful."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from typing import Any

from manager import process
from manager.health.check import FIX_SYNC, Check, Probe, ok, warn
from manager.paths import Paths

TOOLS = ("uv", "node", "ffmpeg", "git")
VERSION_TIMEOUT = 10.0
_VERSION_FLAG = {"ffmpeg": "-version"}
_VERSION = re.compile(r"\d+(?:\.\d+)+")
_MISSING_FIX = {
    "git": "install git (e.g. apt install git, xcode-select --install, or git-scm.com)",
}
_MISSING_EFFECT = {
    "uv": "installs fall back to pip (slower)",
    "node": "the web UI cannot run",
    "ffmpeg": "video datasets cannot be read",
    "git": "`update` cannot work",
}


def judge_tool(name: str, info: Mapping[str, Any] | None) -> Check:
    cid = f"tool.{name}"
    if not info or not info.get("used"):
        return warn(cid, f"{name} not found: {_MISSING_EFFECT.get(name, 'unavailable')}",
                    _MISSING_FIX.get(name, FIX_SYNC))
    version = info.get("version") or "unknown version"
    where = f"{info['used']}: {info.get('path') or '?'}"
    if info.get("ok") is False:
        minimum = info.get("minimum")
        need = f"; {minimum} or newer is needed" if minimum else ""
        return warn(cid, f"{name} {version} ({where}){need}", _MISSING_FIX.get(name, FIX_SYNC))
    return ok(cid, f"{name} {version} ({where})")


def on_path(name: str) -> dict[str, Any] | None:
    found = shutil.which(name)
    if not found:
        return None
    done = process.run([found, _VERSION_FLAG.get(name, "--version")], timeout=VERSION_TIMEOUT)
    found_version = _VERSION.search(done.stdout) if done.ok else None
    version = found_version.group(0) if found_version else None
    return {"tool": name, "used": "system", "path": found, "version": version}


def probe(paths: Paths) -> list[Check]:
    from manager.tools import report_tools

    reported = {t.get("tool"): t for t in report_tools(paths)}
    names = [*TOOLS, *sorted(n for n in reported if n and n not in TOOLS)]
    return [judge_tool(n, reported[n] if n in reported else on_path(n)) for n in names]


def probes(paths: Paths) -> list[Probe]:
    return [Probe(tuple(f"tool.{n}" for n in TOOLS), lambda: probe(paths),
                  VERSION_TIMEOUT * len(TOOLS) + 5)]
