"""Every parameter count an arch description records (aitk/models/<arch>/arch.py) is what
its real full-size part has: each part is built on the meta device (no memory, no
download) from its real config (tests/aitk/models/real_configs.py) with the class aitk
loads it as, then counted, and so are its repeated blocks and what the arch keeps after
dropping modules it never runs."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
from torch import nn

from aitk.models import catalog
from aitk.models.description import Part, PartRole
from tests.aitk.models.real_configs import REAL_PARTS, build


def _trim_qwen_vision(module: nn.Module) -> None:
    from aitk.models.qwen_image.model import drop_vision_tower

    drop_vision_tower(module)


def _trim_klein_layers(module: nn.Module) -> None:
    from aitk.models.flux2_klein.model import TEXT_LAYERS, keep_text_layers

    keep_text_layers(module, max(TEXT_LAYERS) + 1)


def _mistral_language_model_to_layer_31(module: nn.Module) -> None:
    """What flux2 loads of Mistral3ForConditionalGeneration: the language model, cut
    after layer 31 (one past the deepest read), without the vision side or LM head."""
    from aitk.models.flux2.model import TEXT_LAYERS
    from aitk.models.flux2_klein.model import keep_text_layers

    module.model.vision_tower = None
    module.model.multi_modal_projector = None
    module.lm_head = None
    keep_text_layers(module.model.language_model, max(TEXT_LAYERS) + 1)


def _drop_qwen3_vl_vision(module: nn.Module) -> None:
    """What krea2 loads of Qwen3VLModel: the language model, no vision tower."""
    module.visual = None


# (arch, subfolder) -> what the arch's loader does to the part after loading it.
TRIMS: dict[tuple[str, str], Callable[[nn.Module], None]] = {
    ("qwen_image", "text_encoder"): _trim_qwen_vision,
    **{(arch, "text_encoder"): _trim_klein_layers
       for arch in ("flux2_klein_4b", "flux2_klein_9b", "flux2_klein")},
    ("flux2", "text_encoder"): _mistral_language_model_to_layer_31,
    ("krea2", "text_encoder"): _drop_qwen3_vl_vision,
}


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
    trim = TRIMS.get((arch, part.subfolder))
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
