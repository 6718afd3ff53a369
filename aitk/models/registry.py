"""Model registry: `model.arch` -> BaseModel subclass, with its description.

Classes are discovered from

1. the built-in arch descriptions (aitk.models.catalog: each arch folder's torch-free
   `arch.py`); a description names its class as "module:Class", imported only when
   asked for, so listing archs or checking a config imports no heavy library; each
   alias is an entry for the same class; then
2. module-level `AI_TOOLKIT_MODELS` lists in every package directly under
   `<repo root>/extensions/` (a folder with `__init__.py`), then any extra folders
   passed to `discover(extra_dirs=...)`, in name order. A class may carry a
   `description` (aitk.models.description.ArchDescription); one without gets a
   minimal description in which what is not known is None.

An extension that fails to import is recorded (name + error) and skipped; the others
still load. An entry that is not a BaseModel subclass with a non-empty `arch`, or an
arch that is already taken, is recorded too (the first one found wins). Asking for an
unknown arch raises `UnknownArchError`, whose message lists the known archs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aitk.errors import ModelRegistryError, UnknownArchError
from aitk.models import catalog
from aitk.models.description import ArchDescription

__all__ = ["BrokenExtension", "ModelEntry", "ModelRegistryError", "Registry",
           "UnknownArchError", "discover", "get_model_class", "load_model"]

if TYPE_CHECKING:  # torch is imported only to load a model
    import torch

    from aitk.models.base import BaseModel, ModelSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS_DIR = REPO_ROOT / "extensions"


@dataclass(frozen=True)
class ModelEntry:
    arch: str
    target: str | type[BaseModel]  # "module:Class" (built-in, imported on use) or a class
    source: str  # "built-in", "built-in alias of <arch>" or "extension <name> (<path>)"
    description: ArchDescription

    @property
    def class_path(self) -> str:
        if isinstance(self.target, str):
            return self.target.replace(":", ".")
        return f"{self.target.__module__}.{self.target.__qualname__}"

    @property
    def cls(self) -> type[BaseModel]:
        if not isinstance(self.target, str):
            return self.target
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BrokenExtension:
    name: str
    path: str
    error: str  # one line: "ExceptionType: message"
    detail: str = ""  # the traceback, for --verbose listings


@dataclass
class Registry:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    broken: list[BrokenExtension] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def get(self, arch: str) -> type[BaseModel]:
        entry = self.models.get(arch)
        if entry is None:
            raise UnknownArchError(arch, self.models, self.broken)
        return entry.cls

    def description(self, arch: str) -> ArchDescription:
        entry = self.models.get(arch)
        if entry is None:
            raise UnknownArchError(arch, self.models, self.broken)
        return entry.description

    def problems(self) -> list[str]:
        """One line per broken extension and per warning, for a job's log."""
        return ([f"extension {b.name} failed to import ({b.path}): {b.error}"
                 for b in self.broken] + list(self.warnings))

    def _add_all(self, candidates: object, source: str) -> None:
        from aitk.models.base import BaseModel  # extensions import torch anyway

        if not isinstance(candidates, (list, tuple)):
            self.warnings.append(f"{source}: AI_TOOLKIT_MODELS is not a list; ignored")
            return
        for cls in candidates:
            if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
                self.warnings.append(f"{source}: {cls!r} is not a BaseModel subclass; ignored")
                continue
            if not cls.arch:
                self.warnings.append(f"{source}: {cls.__name__} has no `arch`; ignored")
                continue
            taken = self.models.get(cls.arch)
            if taken is not None:
                self.warnings.append(
                    f"{source}: arch {cls.arch!r} ({cls.__name__}) is already registered by "
                    f"{taken.source} ({taken.cls.__name__}); the first one is used")
                continue
            description = cls.describe()
            if description.name != cls.arch:
                self.warnings.append(f"{source}: {cls.__name__}.description is named "
                                     f"{description.name!r}, not its arch {cls.arch!r}")
            self.models[cls.arch] = ModelEntry(cls.arch, cls, source, description)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_extension(folder: Path) -> object:
    """Import `folder` as a package under a private name, so relative imports work."""
    name = f"aitk_extensions.{folder.parent.name}_{abs(hash(str(folder))):x}.{folder.name}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def extension_folders(dirs: Iterable[Path]) -> list[Path]:
    found = []
    for root in dirs:
        root = Path(root)
        if root.is_dir():
            found.extend(sorted(p for p in root.iterdir()
                                if p.is_dir() and (p / "__init__.py").is_file()
                                and not p.name.startswith((".", "_"))))
    return found


def discover(extra_dirs: Iterable[Path] = (), *, include_repo_extensions: bool = True
             ) -> Registry:
    registry = Registry()
    for desc in catalog.builtin_descriptions().values():
        registry.models[desc.name] = ModelEntry(desc.name, desc.model_class, "built-in", desc)
        for alias in desc.aliases:
            registry.models[alias] = ModelEntry(alias, desc.model_class,
                                                f"built-in alias of {desc.name}", desc)
    dirs = ([EXTENSIONS_DIR] if include_repo_extensions else []) + [Path(d) for d in extra_dirs]
    for folder in extension_folders(dirs):
        source = f"extension {folder.name} ({folder})"
        try:
            module = _import_extension(folder)
        except Exception as exc:  # any error in user code: report it, keep the others
            registry.broken.append(BrokenExtension(folder.name, str(folder), _one_line(exc),
                                                   traceback.format_exc()))
            continue
        if not hasattr(module, "AI_TOOLKIT_MODELS"):
            registry.warnings.append(f"{source}: no AI_TOOLKIT_MODELS list; skipped")
            continue
        registry._add_all(module.AI_TOOLKIT_MODELS, source)
    return registry


def get_model_class(arch: str, extra_dirs: Iterable[Path] = (),
                    report: Callable[[str], None] | None = None) -> type[BaseModel]:
    """The class for `arch`; raises UnknownArchError listing the known archs.

    `report` (e.g. the job's logger) receives each line of `Registry.problems()`, so a
    broken extension is visible even when the requested arch loads fine.
    """
    registry = discover(extra_dirs)
    if report is not None:
        for line in registry.problems():
            report(line)
    return registry.get(arch)


def load_model(model_config: ModelSettings, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, registry: Registry | None = None
               ) -> BaseModel:
    """Pick the class for `model_config.arch`, construct it and run its `load_model()`."""
    import torch

    cls = (registry or discover()).get(model_config.arch)
    model = cls(model_config, device=device, dtype=torch.float32 if dtype is None else dtype)
    model.load_model()
    return model
