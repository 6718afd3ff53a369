"""Is this Python the one the trainer runs in? Standard library only.

`run.py` and `python -m aitk` call `check()` before importing anything else, so
`python3 run.py ...` with a system Python that lacks torch or pydantic prints one line
saying how to run it (the checkout's `.venv` Python or `python3 -m manager launch`, or
`./install.sh` when there is no `.venv` yet) and exits 2, instead of a
ModuleNotFoundError traceback. It looks modules up without importing them.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path

from aitk.errors import EXIT_INPUT  # stdlib only, like this module

ROOT = Path(__file__).resolve().parents[2]
# Import names of the trainer's own requirements (requirements.txt, plus torch).
REQUIRED = ("torch", "pydantic", "yaml", "diffusers", "transformers", "safetensors", "PIL",
            "numpy", "rich")


def missing_modules(names: tuple[str, ...] = REQUIRED) -> list[str]:
    found = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                found.append(name)
        except (ImportError, ValueError):  # a broken parent package or odd sys.modules entry
            found.append(name)
    return found


def venv_python(root: Path = ROOT) -> Path:
    return root / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _shown(path: Path) -> str:
    """A path as the user can type it from the current folder."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def advice(missing: list[str], entry: list[str], args: list[str], root: Path = ROOT) -> str:
    """The one line for a Python that lacks `missing`. `entry` is how the trainer was
    started after the interpreter (`["run.py"]` or `["-m", "aitk"]`), `args` the rest;
    `manager launch` takes run.py's arguments."""
    python = _shown(venv_python(root))
    if entry[0] == "run.py":
        entry = [_shown(root / "run.py")]
    redo = shlex.join([python, *entry, *args])
    lacks = f"lacks {_listed(missing)}"
    if not venv_python(root).exists():
        return (f"error: this Python ({sys.executable}) {lacks} and this checkout has no "
                f".venv yet: set it up with ./install.sh (or python3 -m manager install), "
                f"then run {redo}")
    if _inside(root / ".venv"):
        return (f"error: the checkout's environment {lacks}: repair it with "
                f"python3 -m manager sync")
    line = (f"error: this Python ({sys.executable}) {lacks}; run the trainer with the "
            f"checkout's environment: {redo}")
    if entry[-1].endswith("run.py"):
        manager = ["-m", "manager"] if Path.cwd() == root else [_shown(root / "manager")]
        line += f" (or: {shlex.join(['python3', *manager, 'launch', *args])})"
    return line


def _inside(venv: Path) -> bool:
    """Running in `venv` (its python is a link to the base interpreter: compare prefixes)."""
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


def check(entry: list[str], args: list[str]) -> int | None:
    """None when the trainer can run here; else print the advice and return exit 2."""
    missing = missing_modules()
    if not missing:
        return None
    print(advice(missing, entry, args), file=sys.stderr)
    return EXIT_INPUT
