"""uv, node, ffmpeg and git: which copy is used (local in the checkout or the system's)
and its version. manager.tools is the source; a tool it does not report is looked up on
PATH so doctor still says something useful."""

from __future__ import annotations

import os
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
SHARED_BUILD_HINT = ("a system FFmpeg with shared libraries, or "
                     "AITK_ALLOW_UNVERIFIED=ffmpeg for the unverified shared build")
_MISSING_FIX = {
    "git": "install git (e.g. apt install git, xcode-select --install, or git-scm.com)",
}
_MISSING_EFFECT = {
    "uv": "installs fall back to pip (slower)",
    "node": "the web UI cannot run",
    # The trainer decodes video datasets with PyAV, whose wheel bundles FFmpeg's libraries;
    # torchcodec loads the shared libraries of an FFmpeg installed beside it.
    "ffmpeg": "the optional torchcodec package cannot be used (it loads FFmpeg's shared "
              "libraries); the trainer itself does not need this program (video datasets "
              "decode through PyAV's own FFmpeg libraries)",
    "git": "`update` cannot work",
}


def provision_fix(name: str, minimum: str | None, refused: bool,
                  refusal_hint: str | None) -> str:
    """The fix for a missing or too old tool. A sync provisions it, unless the manager
    refuses to (no build pinned for this platform, or no checksum to verify the download):
    then a sync skips it again, and the fix is the user's own copy or the opt-in."""
    if name in _MISSING_FIX:
        return _MISSING_FIX[name]
    if not refused:
        return FIX_SYNC
    if refusal_hint:
        return f"{refusal_hint}, then run python3 -m manager tools --provision"
    need = f" {minimum} or newer" if minimum else ""
    return f"install {name}{need} from your system's packages (none is pinned for this platform)"


def judge_tool(name: str, info: Mapping[str, Any] | None, refused: bool = False,
               refusal_hint: str | None = None) -> Check:
    cid = f"tool.{name}"
    minimum = info.get("minimum") if info else None
    fix = provision_fix(name, minimum, refused, refusal_hint)
    if not info or not info.get("used"):
        return warn(cid, f"{name} not found: {_MISSING_EFFECT.get(name, 'unavailable')}", fix)
    version = info.get("version") or "unknown version"
    where = f"{info['used']}: {info.get('path') or '?'}"
    if info.get("ok") is False:
        need = f"; {minimum} or newer is needed" if minimum else ""
        return warn(cid, f"{name} {version} ({where}){need}", fix)
    if info.get("shared_libraries") is False:
        # True as a line: the program is there; say what it cannot do.
        return ok(cid, f"{name} {version} ({where}); program only, no shared libraries: "
                       f"torchcodec cannot use it ({SHARED_BUILD_HINT})")
    return ok(cid, f"{name} {version} ({where})")


def on_path(name: str) -> dict[str, Any] | None:
    found = shutil.which(name)
    if not found:
        return None
    done = process.run([found, _VERSION_FLAG.get(name, "--version")], timeout=VERSION_TIMEOUT)
    found_version = _VERSION.search(done.stdout) if done.ok else None
    version = found_version.group(0) if found_version else None
    return {"tool": name, "used": "system", "path": found, "version": version}


def refusals(environ: Mapping[str, str], plat: tuple[str, str] | None = None) -> dict[str, Any]:
    """tool name -> why the manager would not provision it on `plat` (default: this
    machine), as its ToolUnavailable."""
    from manager.tools import default_tools
    from manager.tools.lifecycle import Settings, current_platform
    from manager.tools.pins import PINS

    plat, settings = plat or current_platform(), Settings.from_env(environ, PINS)
    found = {t.name: t.refusal(plat, settings) for t in default_tools(environ, plat)}
    return {name: why for name, why in found.items() if why is not None}


def probe(paths: Paths) -> list[Check]:
    from manager.tools import report_tools

    reported = {t.get("tool"): t for t in report_tools(paths)}
    refused = refusals(os.environ)
    names = [*TOOLS, *sorted(n for n in reported if n and n not in TOOLS)]
    return [judge_tool(n, reported[n] if n in reported else on_path(n), n in refused,
                       refused[n].hint if n in refused else None) for n in names]


def probes(paths: Paths) -> list[Probe]:
    return [Probe(tuple(f"tool.{n}" for n in TOOLS), lambda: probe(paths),
                  VERSION_TIMEOUT * len(TOOLS) + 5)]
