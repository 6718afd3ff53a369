"""The models' errors, in a module without torch so the registry and config checks
can raise and catch them without importing any heavy library."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ModelError(Exception):
    """A model that cannot do what was asked (bad folder, missing part, unloaded TE)."""


class ModelLoadError(ModelError):
    """`load_model()` failed: the message names the path and what is missing."""


class ModelKwargsError(ModelLoadError):
    """`model.model_kwargs` does not fit the arch's typed knobs (aitk.models.description):
    one line per problem, naming the key and, for an unknown one, the valid keys."""

    def __init__(self, arch: str, problems: list[str]) -> None:
        self.arch = arch
        self.problems = problems
        super().__init__("; ".join(problems))


class ModelRegistryError(ModelError):
    """The registry cannot give the requested model class."""


class UnknownArchError(ModelRegistryError):
    def __init__(self, arch: str, known: Iterable[str], broken: Iterable[Any] = ()) -> None:
        """`broken`: the extensions that failed to import (registry.BrokenExtension)."""
        self.arch = arch
        self.known = sorted(known)
        listed = ", ".join(self.known) or "none"
        message = f"unknown model arch {arch!r}; known archs: {listed}"
        failed = [f"{b.name} ({b.error})" for b in broken]
        if failed:
            message += f"; extensions that failed to import: {'; '.join(failed)}"
        super().__init__(message + " (`python -m aitk models` lists them with their source)")
