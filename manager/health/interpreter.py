"""The Python running the manager, and the checkout's venv with its Python."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from manager import process
from manager.health.check import FIX_INSTALL, Check, Probe, fail, ok
from manager.paths import Paths

MIN_PYTHON = (3, 10)
VENV_TIMEOUT = 20.0


def judge_python(version: tuple[int, int, int], executable: str) -> Check:
    shown = ".".join(map(str, version))
    if version[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return fail("python", f"Python {shown} at {executable}; {need} or newer is needed",
                    f"install Python {need}+ (or uv), then run ./install.sh")
    return ok("python", f"Python {shown} at {executable}")


@dataclass(frozen=True)
class VenvFacts:
    exists: bool
    python_exists: bool
    python: str
    version: str | None = None  # what the venv's Python printed; None if it did not run
    error: str | None = None


def judge_venv(facts: VenvFacts) -> Check:
    if not facts.exists:
        return fail("venv", "no .venv in the checkout: nothing is installed yet", FIX_INSTALL)
    if not facts.python_exists:
        return fail("venv", f".venv has no Python at {facts.python}",
                    f"delete .venv, then {FIX_INSTALL}")
    if facts.version is None:
        return fail("venv", f"the venv's Python does not run ({facts.error})",
                    f"delete .venv, then {FIX_INSTALL}")
    return ok("venv", f"Python {facts.version} at {facts.python}")


def gather_venv(paths: Paths) -> VenvFacts:
    python = paths.venv_python
    facts = VenvFacts(paths.venv.is_dir(), python.exists(), str(python))
    if not facts.python_exists:
        return facts
    done = process.run([python, "-I", "-c", "import platform; print(platform.python_version())"],
                       timeout=VENV_TIMEOUT)
    if done.ok and done.stdout.strip():
        return VenvFacts(True, True, str(python), version=done.stdout.strip())
    why = "timed out" if done.timed_out else (done.stderr.strip().splitlines() or ["no output"])[-1]
    return VenvFacts(True, True, str(python), error=why)


def probes(paths: Paths) -> list[Probe]:
    def python() -> list[Check]:
        base = getattr(sys, "_base_executable", None) or sys.executable
        return [judge_python(tuple(sys.version_info[:3]), base)]  # type: ignore[arg-type]

    return [
        Probe(("python",), python, 5.0),
        Probe(("venv",), lambda: [judge_venv(gather_venv(paths))], VENV_TIMEOUT + 5),
    ]
