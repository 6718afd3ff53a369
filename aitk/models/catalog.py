"""The built-in archs and their descriptions, without importing any arch (no torch).

`run.py --check`, `manager info`, the web UI and the config schema must answer "is this
arch supported, and what is it?" in well under a second, and importing an arch imports
torch and diffusers. Each folder named in `aitk.models.builtin.ARCH_FOLDERS` declares its
archs in a torch-free `arch.py` (`DESCRIPTIONS`, aitk.models.description); this module
reads those and answers by name or alias. The registry takes each built-in's class from
its description; tests/aitk/models/test_arch_descriptions.py keeps every description
equal to what its loaded model does.

The helpers at the end are what the schema, preflight and audits call: they take a
built-in arch (or alias) and raise UnknownArchError for any other.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from aitk.errors import UnknownArchError
from aitk.models.description import ArchDescription

MODELS_DIR = Path(__file__).resolve().parent
EXTENSIONS_DIR = MODELS_DIR.parents[1] / "extensions"


@cache
def _declared() -> tuple[ArchDescription, ...]:
    from aitk.models.builtin import ARCH_FOLDERS

    found: list[ArchDescription] = []
    for folder in ARCH_FOLDERS:
        module = importlib.import_module(f"aitk.models.{folder}.arch")
        found.extend(module.DESCRIPTIONS)
    names = [n for d in found for n in d.names]
    taken = sorted({n for n in names if names.count(n) > 1})
    if taken:  # a programming error in aitk itself, caught by the quick tests
        raise RuntimeError(f"arch names declared twice: {', '.join(taken)}")
    return tuple(found)


def builtin_descriptions() -> dict[str, ArchDescription]:
    """Every built-in arch by its name (aliases are not keys), in registration order."""
    return {d.name: d for d in _declared()}


def descriptions() -> list[ArchDescription]:
    return list(builtin_descriptions().values())


def builtin_archs() -> set[str]:
    """Every `model.arch` value a built-in answers to: names and aliases."""
    return {n for d in builtin_descriptions().values() for n in d.names}


def description(arch: str) -> ArchDescription:
    """The description of a built-in arch, by name or alias."""
    for desc in builtin_descriptions().values():
        if arch in desc.names:
            return desc
    raise UnknownArchError(arch, builtin_archs())


def has_extensions(folder: Path = EXTENSIONS_DIR) -> bool:
    """Whether extensions/ holds a package that could register more archs."""
    return folder.is_dir() and any(p.is_dir() and (p / "__init__.py").is_file()
                                   and not p.name.startswith((".", "_"))
                                   for p in folder.iterdir())


# ---- what the schema, preflight and audits ask -------------------------------------------
def validate_model_kwargs(arch: str, kwargs: Mapping[str, Any] | None) -> list[str]:
    """The problems of `model.model_kwargs` for `arch`, one line each ([] = fine); an
    unknown key names the arch's valid ones."""
    return description(arch).check_model_kwargs(kwargs)


def noise_schedulers(arch: str) -> tuple[str, ...]:
    """The `train.noise_scheduler` values `arch` trains with; the first is its default."""
    schedule = description(arch).schedule
    assert schedule is not None, f"built-in arch {arch} declares no schedule"
    return schedule.noise_schedulers


def trains_text_encoders(arch: str) -> bool:
    """Whether `arch` has a text-encoder LoRA (`train.train_text_encoder`)."""
    lora = description(arch).lora
    return lora is not None and bool(lora.text_encoders)


def size_multiple(arch: str) -> int:
    """Image sides (and bucket resolutions) of `arch` are multiples of this."""
    multiple = description(arch).size_multiple
    assert multiple is not None, f"built-in arch {arch} declares no size multiple"
    return multiple
