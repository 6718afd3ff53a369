"""The real, full-size configs of every model part an arch description counts
(`Variant.parts` in aitk/models/<folder>/arch.py), each arch folder's own
`real_parts.py`: `REAL_PARTS`, keyed by (hub repo, subfolder), and optionally `KEPT`,
what the arch's loader drops from a part after loading it (subfolder -> a function on
the built module).

They are facts of the arch as published, kept beside it so that adding an arch stays a
change to its own folder: tests/aitk/models/test_arch_part_sizes.py builds each part on
the meta device (`build`: no memory, no download) with the class aitk loads it as and
holds every recorded parameter count to it, and bench/memory_forecast.py builds
full-size random-init models from them. Only the keys that shape the weights are kept
(no `_class_name`, token ids, dropout or init ranges); each entry names where its
values were read: the hub repos are gated or too large to fetch here, so the values
come from public code that reproduces the hub's config.json, and the well-known totals
they give (FLUX.1 dev's 11.9B, T5-XXL's 4.76B, SDXL's 2.57B UNet) confirm them.

Importing this module (or a folder's `real_parts`) imports no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class RealPart:
    library: str  # "diffusers" (or a module of it), "transformers", or "aitk"
    cls: str  # the class aitk's loader builds this part as
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def build(real: RealPart) -> nn.Module:
    """The part on the meta device: its shapes, no memory."""
    import torch

    with torch.device("meta"):
        if real.library == "aitk":
            from aitk.models.example.transformer import ExampleTransformer

            return ExampleTransformer.from_config(real.config)
        if real.library.startswith("diffusers"):  # or a submodule: diffusers.pipelines.ltx2
            module = importlib.import_module(real.library)
            return getattr(module, real.cls).from_config(real.config)
        import transformers

        cls = getattr(transformers, real.cls)
        return cls(cls.config_class(**real.config))


def _folder_module(folder: str) -> Any | None:
    try:
        return importlib.import_module(f"aitk.models.{folder}.real_parts")
    except ModuleNotFoundError as exc:
        if exc.name != f"aitk.models.{folder}.real_parts":
            raise
        return None


@cache
def real_parts() -> dict[tuple[str, str], RealPart]:
    """Every built-in arch folder's REAL_PARTS, merged."""
    from aitk.models.builtin import ARCH_FOLDERS

    merged: dict[tuple[str, str], RealPart] = {}
    for folder in ARCH_FOLDERS:
        module = _folder_module(folder)
        merged.update(getattr(module, "REAL_PARTS", {}) if module else {})
    return merged


def kept(folder: str) -> dict[str, Callable[[nn.Module], None]]:
    """What the folder's loader drops after loading a part (subfolder -> function)."""
    module = _folder_module(folder)
    return dict(getattr(module, "KEPT", {})) if module else {}
