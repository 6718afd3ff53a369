"""Local tools (.uv, .node, .ffmpeg, .mingit): which copy is used, provisioning, and the
environment children get.

`find_uv`/`ensure_uv` are what the sync engine uses to choose its installer;
`provision_all` is its "tools" step (never raises for one tool); `report_tools` feeds
`manager tools` and `doctor`; `child_env` is what `launch` and the venv's Python get so
they see the local tools; `require` is the error at a command that needs a tool.

Layout: pins.py (the table), lifecycle.py (queries + the install action), one module
per tool; the downloader is manager/download.py and the archive installer
manager/archive.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from manager.errors import ManagerError
from manager.paths import Paths
from manager.tools.ffmpeg import Ffmpeg
from manager.tools.lifecycle import (
    Context,
    Found,
    Settings,
    Tool,
    ToolUnavailable,
    current_platform,
    platform_label,
)
from manager.tools.mingit import MinGit
from manager.tools.node import Node
from manager.tools.pins import PINS, Platform
from manager.tools.uv import Uv, python_dir

__all__ = [
    "ToolUnavailable", "available", "child_env", "compose_env", "default_tools", "ensure_uv",
    "find_uv", "package_need", "provision", "provision_all", "refusal_hint", "refused",
    "report_tools", "require",
]

LIBRARY_PATH_VAR = {"linux": "LD_LIBRARY_PATH", "macos": "DYLD_LIBRARY_PATH",
                    "windows": "PATH"}
FFMPEG_LIB_ENV = "AITK_FFMPEG_LIB_DIR"


def default_tools(env: Mapping[str, str] | None = None,
                  plat: Platform | None = None) -> tuple[Tool, ...]:
    # FFmpeg's pin depends on the user's opt-in to the unverified shared build (and on
    # whether the platform has one).
    ffmpeg = Ffmpeg.from_env(os.environ if env is None else env, plat or current_platform())
    return (Uv(), Node(), ffmpeg, MinGit())


def _context(env: Mapping[str, str] | None = None) -> Context:
    return Context(Settings.from_env(os.environ if env is None else env, PINS))


def _installing(ctx: Context) -> Context:
    """The context with a progress reporter, for an install (the downloader and its
    httpx and rich load here, not when a no-op sync asks which copy is used)."""
    from manager.download import reporter_for

    if ctx.reporter is None:
        ctx.reporter = reporter_for()
    return ctx


def find_uv(paths: Paths) -> Path | None:
    """A uv good enough to use (system or .uv/), or None."""
    found = Uv().resolve(paths, current_platform(), probe=False)
    return Path(found.path) if found.ok and found.path else None


def ensure_uv(paths: Paths) -> Path | None:
    """A usable uv, provisioning .uv/ when needed; None when none can be had (use pip)."""
    found = find_uv(paths)
    if found:
        return found
    import httpx

    ctx = _installing(_context())
    try:
        installed = Uv().install(paths, current_platform(), ctx)
    except (ManagerError, OSError, httpx.HTTPError) as exc:
        if ctx.reporter:
            ctx.reporter.note(f"warning: uv could not be provisioned ({exc}); using pip")
        return None
    return Path(installed.path) if installed.path else None


def provision_all(paths: Paths, report: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Provision every missing tool this platform needs. Never raises for one tool's
    failure: each outcome ({"status": "ok"|"system"|"failed"|"skipped", "version",
    "path", "detail"}) is returned for the state's `tools` record."""
    return provision(default_tools(), paths, current_platform(), _context(), report)


def provision(tools: Sequence[Tool], paths: Paths, plat: Platform, ctx: Context,
              report: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The driver: for each tool, use what is good enough or install the pinned copy.
    `skipped`: nothing was tried (no build for this platform, unverified and not opted
    in); `failed`: an install was tried and did not finish (previous copy kept)."""
    import httpx

    outcomes: dict[str, dict[str, Any]] = {}
    for tool in tools:
        found = tool.resolve(paths, plat)
        if found.ok:
            status = "system" if found.used == "system" else "ok"
            outcomes[tool.name] = _outcome(status, found)
            continue
        refused = tool.refusal(plat, ctx.settings)
        if refused:
            report(f"warning: {tool.name} skipped: {refused.message}")
            outcomes[tool.name] = _outcome("skipped", found, refused.message)
            continue
        report(f"{tool.name}: {found.detail}; installing {tool.name} {tool.pin.version}")
        try:
            installed = tool.install(paths, plat, _installing(ctx))
        except ToolUnavailable as exc:
            report(f"warning: {tool.name} skipped: {exc.message}")
            outcomes[tool.name] = _outcome("skipped", found, exc.message)
        except (ManagerError, OSError, httpx.HTTPError) as exc:
            message = exc.message if isinstance(exc, ManagerError) else str(exc)
            report(f"warning: {tool.name} could not be provisioned: {message}")
            outcomes[tool.name] = _outcome("failed", found, message)
        else:
            outcomes[tool.name] = _outcome("ok", installed)
    return outcomes


def _outcome(status: str, found: Found, detail: str | None = None) -> dict[str, Any]:
    return {"status": status, "version": found.version, "path": found.path,
            "detail": detail if detail is not None else found.detail}


def report_tools(paths: Paths) -> list[dict[str, Any]]:
    """For `manager tools` and `doctor`: tool (its name), used ("system"|"local"|None),
    version, path, minimum, ok."""
    plat = current_platform()
    rows = []
    for tool in default_tools():
        found = tool.resolve(paths, plat)
        row = asdict(found)
        row.update(**tool.report_extra(found, paths, plat),
                   minimum=tool.pin.minimum, pinned=tool.pin.version,
                   local_dir=str(tool.target(paths)),
                   provisionable=tool.pin.artefact(plat) is not None,
                   checksum=tool.pin.checksum_source)
        rows.append(row)
    return rows


# What an optional package needing a tool needs of it, when more than the program.
_PACKAGE_NEEDS = {"ffmpeg": "ffmpeg with its shared libraries"}


def package_need(name: str) -> str:
    """How to name a tool in "<package> needs ..." (torchcodec loads FFmpeg's libraries)."""
    return _PACKAGE_NEEDS.get(name, name)


def _tool(name: str) -> Tool | None:
    return next((t for t in default_tools() if t.name == name), None)


def available(paths: Paths, name: str, probe: bool = True) -> bool:
    """Is a copy of the tool here that the optional packages needing it can use (local or
    system)? torchcodec loads FFmpeg's shared libraries: the static program is not enough."""
    tool = _tool(name)
    if tool is None:
        return False
    plat = current_platform()
    return tool.serves_packages(tool.resolve(paths, plat, probe=probe), paths, plat)


def refused(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Would provisioning refuse this tool here (no build, unverified and not opted in)?"""
    tool = next((t for t in default_tools(env) if t.name == name), None)
    return tool is None or tool.refusal(current_platform(), _context(env).settings) is not None


def refusal_hint(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """What gets a tool the manager refuses to download here (its ToolUnavailable hint)."""
    tool = next((t for t in default_tools(env) if t.name == name), None)
    if tool is None:
        return None
    refused = tool.refusal(current_platform(), _context(env).settings)
    return refused.hint if refused else None


def require(name: str, paths: Paths) -> Path:
    """The executable of a tool a command cannot do without; ToolUnavailable if none."""
    tool = next(t for t in default_tools() if t.name == name)
    found = tool.resolve(paths, current_platform())
    if not found.ok or not found.path:
        raise ToolUnavailable(f"{name} is needed but not available: {found.detail}",
                              hint="run `python3 -m manager tools --provision`, or see "
                                   "`python3 -m manager tools` for what is missing")
    return Path(found.path)


def child_env(paths: Paths) -> dict[str, str]:
    """Environment additions (PATH, library paths) for processes that use the tools.

    Library paths only work for a process started with them (the loader reads them at
    start-up), so `launch` runs the venv's Python as a child with this environment.
    """
    plat = current_platform()
    bins: list[Path] = []
    libs: list[Path] = []
    for tool in default_tools():
        found = tool.resolve(paths, plat, probe=False)
        if found.ok and found.used == "local":
            root = tool.target(paths)
            bins += tool.bin_dirs(root, plat)
            libs += tool.lib_dirs(root, plat)
    return compose_env(plat, bins, libs, os.environ, python_dir(paths))


def compose_env(plat: Platform, bins: Sequence[Path], libs: Sequence[Path],
                base: Mapping[str, str], uv_python: Path) -> dict[str, str]:
    """Pure: the variables to add for children, prepending to what `base` has."""
    env: dict[str, str] = {"UV_PYTHON_INSTALL_DIR": str(uv_python)}
    sep = ";" if plat[0] == "windows" else ":"

    def prepend(var: str, dirs: Sequence[Path]) -> None:
        current = env.get(var, base.get(var, ""))
        env[var] = sep.join([*(str(d) for d in dirs), *([current] if current else [])])

    if libs:
        # Only FFmpeg contributes library folders; tell the trainer where they are too.
        env[FFMPEG_LIB_ENV] = str(libs[0])
    lib_var = LIBRARY_PATH_VAR.get(plat[0], "LD_LIBRARY_PATH")
    if lib_var == "PATH":  # Windows: programs first, then the folders holding DLLs
        bins, libs = [*bins, *(d for d in libs if d not in bins)], []
    if bins:
        prepend("PATH", bins)
    if libs:
        prepend(lib_var, libs)
    return env


def platform_name() -> str:
    return platform_label(current_platform())
