"""uv and pip behind one interface: install, force-reinstall, uninstall in the venv.

Both get the same request; the uv backend also gets the user's pip configuration as
flags (see indexes.py). Output streams as it comes to the sync's log file (or stderr
without one), and stdout stays free for `--json`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from manager import process
from manager.indexes import IndexConfig, uv_args, uv_env


@dataclass(frozen=True)
class Request:
    requirements: tuple[str, ...] = ()
    requirement_files: tuple[Path, ...] = ()
    constraints: tuple[Path, ...] = ()
    index_url: str | None = None  # an index searched first (the PyTorch index)
    force_reinstall: bool = False  # really replace the files, even at the same version
    no_deps: bool = False


@dataclass(frozen=True)
class Outcome:
    ok: bool
    output: str  # the last lines of the installer's output

    def last_line(self) -> str:
        """The most telling line of a failure: uv's explanation, pip's first error."""
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        for line in lines:  # uv explains a failed resolution after these markers
            for marker in ("╰─▶", "cause:"):
                if marker in line:
                    return line.split(marker, 1)[1].strip()
        errors = [ln for ln in lines if ln.startswith(("ERROR:", "error:", "×"))]
        telling = [ln for ln in errors if "ResolutionImpossible" not in ln]
        return (telling or errors or lines or ["(no output)"])[0 if telling or errors else -1]


class Installer(Protocol):
    name: str

    def install(self, request: Request) -> Outcome: ...

    def uninstall(self, names: Sequence[str]) -> Outcome: ...


def _echo(target: TextIO | None) -> TextIO:
    # The sync's log file when it has one (runlog.py); otherwise the terminal's stderr.
    return target if target is not None else sys.stderr


@dataclass
class PipInstaller:
    python: Path
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "pip"
    echo: TextIO | None = None  # where the installer's output goes; None: stderr

    def _run(self, args: list[str]) -> Outcome:
        argv = [str(self.python), "-m", "pip", *args]
        done = process.run(argv, extra_env={"PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                            "PIP_NO_INPUT": "1", **self.env},
                           echo=_echo(self.echo))
        return Outcome(done.ok, done.stdout + done.stderr)

    def install(self, request: Request) -> Outcome:
        args = ["install", "--progress-bar", "off"]
        if request.index_url:
            # The PyTorch index replaces PyPI for this pass; pip's configured extra
            # indexes and find-links still apply (they are where a mirror or offline
            # copy of the exact build lives).
            args += ["--index-url", request.index_url]
        if request.force_reinstall:
            args.append("--force-reinstall")
        if request.no_deps:
            args.append("--no-deps")
        for c in request.constraints:
            args += ["-c", str(c)]
        for f in request.requirement_files:
            args += ["-r", str(f)]
        args += list(request.requirements)
        return self._run(args)

    def uninstall(self, names: Sequence[str]) -> Outcome:
        return self._run(["uninstall", "-y", *names])


@dataclass
class UvInstaller:
    uv: Path
    python: Path
    config: IndexConfig
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "uv"
    echo: TextIO | None = None  # where the installer's output goes; None: stderr

    def _run(self, args: list[str]) -> Outcome:
        extra = {**uv_env(self.config), **self.env}
        # Copy files out of uv's cache: a file broken in the venv must never be a file
        # broken in the cache, or a forced repair would put the broken copy back.
        if "UV_LINK_MODE" not in os.environ:
            extra["UV_LINK_MODE"] = "copy"
        argv = [str(self.uv), "pip", *args, "--python", str(self.python)]
        done = process.run(argv, extra_env=extra, echo=_echo(self.echo))
        return Outcome(done.ok, done.stdout + done.stderr)

    def install(self, request: Request) -> Outcome:
        # Bytecode at install, as pip does by default: where .pyc files cannot be written
        # later (a read-only install, PYTHONDONTWRITEBYTECODE) every start would compile
        # diffusers and transformers from source again (twice the time to the first step).
        args = ["install", "--compile-bytecode"]
        if request.index_url:
            args += ["--index", request.index_url]
        args += uv_args(self.config)
        if request.force_reinstall:
            args.append("--reinstall")
        if request.no_deps:
            args.append("--no-deps")
        for c in request.constraints:
            args += ["--constraints", str(c)]
        for f in request.requirement_files:
            args += ["-r", str(f)]
        args += list(request.requirements)
        return self._run(args)

    def uninstall(self, names: Sequence[str]) -> Outcome:
        return self._run(["uninstall", *names])
