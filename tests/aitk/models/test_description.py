"""The description types (aitk.models.description): typed model_kwargs and their
problems, frame rules, variants, and extensions with and without a description."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from aitk.errors import ModelKwargsError, ModelLoadError
from aitk.models import catalog
from aitk.models.description import (
    AnyKwargs,
    ArchDescription,
    Frames,
    Part,
    PartRole,
    Variant,
    minimal_description,
)
from aitk.models.registry import discover, load_model
from tests.aitk.models.conftest import ModelCfg


def test_frames_rule() -> None:
    rule = Frames(4)
    assert [n for n in range(1, 14) if rule.allows(n)] == [1, 5, 9, 13]
    assert not rule.allows(0) and str(rule) == "4k+1"


def test_variant_totals_and_parts() -> None:
    known = Variant("a", "", ("r",), (Part("transformer", PartRole.DENOISER, 10),
                                      Part("vae", PartRole.VAE, 2, float32=True)))
    assert known.params == 12 and known.part("vae").params == 2
    assert Part("t", PartRole.TEXT_ENCODER, 9, kept_params=7).resident_params == 7
    unknown = Variant("b", "", ("r",), (Part("transformer", PartRole.DENOISER, None),))
    assert unknown.params is None
    with pytest.raises(KeyError, match="a has no part 'unet'"):
        known.part("unet")
    with pytest.raises(KeyError, match="flux has no variant 'pro'; it has dev, schnell"):
        catalog.description("flux").variant("pro")


def test_parse_model_kwargs_gives_typed_knobs_or_one_error() -> None:
    klein = catalog.description("flux2_klein_4b")
    knobs = klein.parse_model_kwargs({"text_encoder_out_layers": [2, 5], "shift_steps": 8})
    assert knobs.text_encoder_out_layers == (2, 5) and knobs.shift_steps == 8
    assert knobs.is_distilled is None  # unset: model_index.json decides
    with pytest.raises(ModelKwargsError) as info:
        klein.parse_model_kwargs({"shift_step": 8, "is_distilled": "maybe"})
    assert isinstance(info.value, ModelLoadError)  # the job maps it to a config error
    assert info.value.problems == [
        "model.model_kwargs.is_distilled: Input should be a valid boolean, unable to "
        "interpret input",
        "model.model_kwargs.shift_step: not a knob of arch flux2_klein_4b; its model_kwargs: "
        "max_sequence_length, text_encoder_out_layers, shift_steps, is_distilled, "
        "match_target_res"]


def test_a_typo_in_model_kwargs_stops_the_load_naming_the_valid_keys(example_dir: Path
                                                                     ) -> None:
    with pytest.raises(ModelKwargsError, match="attention_backnd: not a knob of arch "
                       "example; its model_kwargs: attention_backend"):
        load_model(ModelCfg(name_or_path=str(example_dir),
                            model_kwargs={"attention_backnd": "flash"}))


def test_an_arch_without_a_description_takes_any_kwargs() -> None:
    class Bare:
        """A model someone wrote.

        More text."""
        arch = "bare"

    desc = minimal_description(Bare)
    assert (desc.name, desc.summary) == ("bare", "A model someone wrote.")
    assert desc.model_class.endswith(":test_an_arch_without_a_description_takes_any_kwargs."
                                     "<locals>.Bare")
    assert desc.size_multiple is None and desc.schedule is None and desc.lora is None
    assert desc.capabilities is None and desc.variants == () and desc.defaults is None
    knobs = desc.parse_model_kwargs({"anything": 3})
    assert isinstance(knobs, AnyKwargs) and knobs.anything == 3
    assert desc.check_model_kwargs({"x": 1}) == []


EXTENSION = """
from aitk.models.description import ArchDescription, ArchKwargs, Capabilities
from aitk.models.example.model import ExampleModel


class Knobs(ArchKwargs):
    depth: int = 2


class Described(ExampleModel):
    arch = "described"
    description = ArchDescription(
        name="described", summary="an extension that says what it is",
        model_class=__name__ + ":Described", size_multiple=8,
        capabilities=Capabilities(), model_kwargs=Knobs)


class Undescribed(ExampleModel):
    \"\"\"An extension that says nothing.\"\"\"
    arch = "undescribed"


class Misnamed(ExampleModel):
    arch = "misnamed"
    description = Described.description


AI_TOOLKIT_MODELS = [Described, Undescribed, Misnamed]
"""


def test_extensions_register_with_their_description_or_a_minimal_one(tmp_path: Path) -> None:
    package = tmp_path / "ext" / "mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(EXTENSION), encoding="utf-8")
    found = discover([tmp_path / "ext"], include_repo_extensions=False)
    assert found.broken == []
    described = found.description("described")
    assert isinstance(described, ArchDescription) and described.size_multiple == 8
    assert found.get("described").describe() is described
    minimal = found.description("undescribed")
    assert minimal.summary == "An extension that says nothing."
    assert minimal.size_multiple is None and minimal.schedule is None
    assert found.description("example") is catalog.description("example")
    assert any("Misnamed.description is named 'described', not its arch 'misnamed'" in w
               for w in found.warnings)
