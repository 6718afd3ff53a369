"""The built-in arch names, read from the source without importing it (no torch).

`run.py --check` must answer "is this arch supported?" in well under a second, and
importing an arch imports torch and diffusers. The built-in archs are the classes listed
in `aitk/models/builtin/__init__.py`'s AI_TOOLKIT_MODELS; each class sets
`arch = "name"`. This reads both with `ast`. tests/aitk/models/test_catalog.py keeps
it equal to what the registry finds by importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
BUILTIN_INIT = MODELS_DIR / "builtin" / "__init__.py"
EXTENSIONS_DIR = MODELS_DIR.parents[1] / "extensions"


def _listed_classes(tree: ast.Module) -> tuple[dict[str, str], list[str]]:
    """(imported name -> module, names in AI_TOOLKIT_MODELS) of builtin/__init__.py."""
    imports: dict[str, str] = {}
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imports[alias.asname or alias.name] = node.module
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "AI_TOOLKIT_MODELS" for t in targets):
            value = node.value
            if isinstance(value, ast.List | ast.Tuple):
                listed += [e.id for e in value.elts if isinstance(e, ast.Name)]
    return imports, listed


def _module_files(module: str) -> list[Path]:
    """The files of `aitk.models.x[.y]`: the module file, or every file of the package."""
    parts = module.split(".")
    if parts[:2] != ["aitk", "models"]:
        return []
    base = MODELS_DIR.joinpath(*parts[2:])
    if base.is_dir():
        return sorted(base.rglob("*.py"))
    file = base.with_suffix(".py")
    return [file] if file.is_file() else []


def _class_arch(files: list[Path], class_name: str) -> str | None:
    for file in files:
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ClassDef) and node.name == class_name):
                continue
            for stmt in node.body:
                target = (stmt.targets[0] if isinstance(stmt, ast.Assign) and stmt.targets
                          else stmt.target if isinstance(stmt, ast.AnnAssign) else None)
                value = getattr(stmt, "value", None)
                if isinstance(target, ast.Name) and target.id == "arch" and \
                        isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
    return None


def builtin_archs(init_file: Path = BUILTIN_INIT) -> set[str]:
    try:
        tree = ast.parse(init_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    imports, listed = _listed_classes(tree)
    found = set()
    for name in listed:
        arch = _class_arch(_module_files(imports.get(name, "")), name)
        if arch:
            found.add(arch)
    return found


def has_extensions(folder: Path = EXTENSIONS_DIR) -> bool:
    """Whether extensions/ holds a package that could register more archs."""
    return folder.is_dir() and any(p.is_dir() and (p / "__init__.py").is_file()
                                   and not p.name.startswith((".", "_"))
                                   for p in folder.iterdir())
