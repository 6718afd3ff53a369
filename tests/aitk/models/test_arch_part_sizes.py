"""Every parameter count an arch description records (aitk/models/<arch>/arch.py) is what
its real full-size part has: each part is built on the meta device (no memory, no
download) from its real config (the arch folder's real_parts.py; aitk.models.real_parts)
with the class aitk loads it as, then counted, and so are its repeated blocks and what
the arch keeps after dropping modules it never runs (the folder's KEPT)."""

from __future__ import annotations

from functools import cache

import pytest
from torch import nn

from aitk.models import catalog
from aitk.models.description import Part, PartRole
from tests.aitk.models.real_configs import REAL_PARTS, build, kept


def folder_of(arch: str) -> str:
    """The arch's folder under aitk/models/ (its model class lives there)."""
    return catalog.description(arch).model_class.split(".")[2]


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # tied weights once


def blocks_of(module: nn.Module) -> tuple[int, int]:
    """The items of the top-level ModuleLists and their parameters."""
    lists = [c for c in module.children() if isinstance(c, nn.ModuleList)]
    return sum(len(x) for x in lists), sum(count(x) for x in lists)


@cache
def measured(repo: str, subfolder: str) -> tuple[int, int, int]:
    module = build(REAL_PARTS[(repo, subfolder)])
    return (count(module), *blocks_of(module))


def recorded() -> list[tuple[str, str, Part]]:
    """(arch, variant's first repo, part) for every part a description counts."""
    return [(d.name, v.repos[0], p) for d in catalog.descriptions() for v in d.variants
            for p in v.parts if p.params is not None]


@pytest.mark.parametrize(("arch", "repo", "part"), recorded(),
                         ids=lambda x: x.subfolder if isinstance(x, Part) else str(x))
def test_recorded_count_is_the_real_configs(arch: str, repo: str, part: Part) -> None:
    params, blocks, block_params = measured(repo, part.subfolder)
    assert part.params == params
    if part.role is PartRole.DENOISER:
        assert (part.blocks, part.block_params) == (blocks, block_params)
    else:
        assert (part.blocks, part.block_params) == (0, 0)
    trim = kept(folder_of(arch)).get(part.subfolder)
    if trim is None:
        assert part.kept_params is None
    else:
        module = build(REAL_PARTS[(repo, part.subfolder)])
        trim(module)
        assert part.kept_params == count(module) < params


def test_every_real_config_backs_a_recorded_count() -> None:
    used = {(repo, part.subfolder) for _, repo, part in recorded()}
    assert used == set(REAL_PARTS), "a real config no description counts, or a count " \
                                    "with no config behind it"
    assert all(real.source for real in REAL_PARTS.values())


def test_unknown_sizes_are_marked_unknown() -> None:
    """prx_pixel's released config was not readable: its parts say None, not a guess."""
    [variant] = catalog.description("prx_pixel").variants
    assert variant.params is None and all(p.params is None for p in variant.parts)
    assert catalog.description("flux").variant("dev").params == (
        11_901_408_320 + 123_060_480 + 4_762_310_656 + 83_819_683)


def test_each_folder_holds_the_real_configs_of_its_own_archs() -> None:
    """An arch's real configs live in its own folder (adding an arch is its folder plus
    one registration line): each folder's REAL_PARTS is exactly what its archs count."""
    import importlib

    from aitk.models.builtin import ARCH_FOLDERS

    for folder in ARCH_FOLDERS:
        counted = {(repo, part.subfolder) for arch, repo, part in recorded()
                   if folder_of(arch) == folder}
        try:
            module = importlib.import_module(f"aitk.models.{folder}.real_parts")
        except ModuleNotFoundError:
            assert not counted, f"{folder} counts parts but has no real_parts.py"
            continue
        assert set(module.REAL_PARTS) == counted, folder
        assert set(getattr(module, "KEPT", {})) <= {sub for _, sub in counted}, folder
