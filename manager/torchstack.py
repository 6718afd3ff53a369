"""The torch stack guard: exact pins, verification by import, forced repair.

Every pass after the torch install carries a constraints file that pins the exact
builds (local tag included), so no requirement or accelerator can swap torch. After a
pass the stack is imported in the venv; a disturbed member is force-reinstalled (a plain
reinstall is "already satisfied" to pip and uv and changes nothing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aitk_common.files import atomic_write_text
from manager import process
from spec import Spec, Wheel

# Runs inside the venv: import each module, report its version or the error. Printed
# as one JSON line after a marker, because an import may print to stdout itself.
_PROBE = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        mod = importlib.import_module(name)
        out[name] = {"ok": True, "version": str(getattr(mod, "__version__", ""))}
    except BaseException as exc:
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000]}
print("@@AITK@@" + json.dumps(out))
"""


def import_name(wheel: Wheel) -> str:
    return wheel.import_name or wheel.name.replace("-", "_")


MANAGER_REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"


def manager_pins() -> list[str]:
    """The manager's own exact pins. It shares .venv with the trainer, so they constrain
    every pass too: no trainer requirement may move a package under the running CLI."""
    lines = MANAGER_REQUIREMENTS.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def constraints_text(spec: Spec) -> str:
    lines = ["# Written by the aitk manager: the exact torch stack for this machine,"
             " then the manager's own pins."]
    lines += [w.requirement for w in (spec.torch, *spec.companions)]
    lines += manager_pins()
    return "\n".join(lines) + "\n"


def write_constraints(spec: Spec, path: Path) -> Path:
    atomic_write_text(path, constraints_text(spec))
    return path


@dataclass(frozen=True)
class ImportCheck:
    ok: bool
    version: str = ""
    error: str = ""  # the whole message; some (torchcodec's) run to a dozen lines

    @property
    def summary(self) -> str:
        """The error's first line: what a warning, the state and a table cell show."""
        lines = [ln.strip() for ln in self.error.splitlines() if ln.strip()]
        return lines[0] if lines else self.error


def import_modules(python: Path, modules: list[str], timeout: float = 600.0,
                   extra_env: Mapping[str, str] | None = None) -> dict[str, ImportCheck]:
    """Import modules in the venv's Python, each in turn; never raises."""
    done = process.run([str(python), "-c", _PROBE, *modules], timeout=timeout,
                       extra_env=extra_env)
    marker = next((ln for ln in done.stdout.splitlines() if ln.startswith("@@AITK@@")), None)
    if marker is None:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {m: ImportCheck(False, error=f"the venv's Python failed: {why}") for m in modules}
    raw = json.loads(marker[len("@@AITK@@"):])
    return {m: ImportCheck(bool(r.get("ok")), str(r.get("version", "")), str(r.get("error", "")))
            for m, r in raw.items()}


def judge(wheel: Wheel, check: ImportCheck | None) -> str | None:
    """None when the import worked and reports the pinned build; else what is wrong."""
    if check is None:
        return "not checked"
    if not check.ok:
        return check.summary
    if check.version and check.version != wheel.pinned:
        return f"imports as {check.version}, expected {wheel.pinned}"
    return None


def verify(python: Path, wheels: list[Wheel]) -> dict[str, str | None]:
    """name -> problem (None: fine) for each wheel, by importing it in the venv."""
    checks = import_modules(python, [import_name(w) for w in wheels])
    return {w.name: judge(w, checks.get(import_name(w))) for w in wheels}
