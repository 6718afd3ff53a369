"""The built-in arch names without importing any arch (no torch).

`run.py --check` and `manager info` must answer "is this arch supported?" in well
under a second, and importing an arch imports torch and diffusers. The built-in archs
are named, not imported, in aitk.models.builtin.BUILTIN_ARCHS;
tests/aitk/models/test_catalog.py keeps that table equal to what the registry finds by
importing.
"""

from __future__ import annotations

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
EXTENSIONS_DIR = MODELS_DIR.parents[1] / "extensions"


def builtin_archs() -> set[str]:
    from aitk.models.builtin import BUILTIN_ARCHS

    return set(BUILTIN_ARCHS)


def has_extensions(folder: Path = EXTENSIONS_DIR) -> bool:
    """Whether extensions/ holds a package that could register more archs."""
    return folder.is_dir() and any(p.is_dir() and (p / "__init__.py").is_file()
                                   and not p.name.startswith((".", "_"))
                                   for p in folder.iterdir())
