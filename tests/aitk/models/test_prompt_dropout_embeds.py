"""`get_prompt_embeds_dropped` (train.prompt_dropout_prob): on the tiny SDXL each text
encoder's part of a row is blanked on its own (that encoder's embedding of "", as
upstream's encode_prompts_xl), the pooled embedding following encoder 2; a
single-encoder arch blanks the whole row (the embedding of "")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aitk.models.registry import load_model
from aitk.models.sdxl.model import SDXLModel
from aitk.models.stable_diffusion.model import SD1Model
from tests.aitk.models.arch_checks import model_cfg, tiny_model_folder

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]

sdxl_dir = tiny_model_folder(SDXLModel, scope="session")
sd1_dir = tiny_model_folder(SD1Model, scope="session")
CAPTIONS = ["a red circle", "a green square", "a blue triangle"]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_sdxl_blanks_each_encoders_part_on_its_own(sdxl_dir: Path) -> None:
    model = load_model(model_cfg("sdxl", sdxl_dir))
    assert model.prompt_dropout_encoders == 2
    full = model.get_prompt_embeds(CAPTIONS)
    empty = model.get_prompt_embeds([""])
    d1 = model.text_encoder.config.hidden_size
    blanks = ((True, False), (False, True), (False, False))
    out = model.get_prompt_embeds_dropped(CAPTIONS, blanks)
    text, pooled = out["text_embeds"], out["pooled_embeds"]
    # row 0: encoder 1 blanked, encoder 2 (and its pooled output) the caption's
    assert close(text[0][:, :d1], empty["text_embeds"][0][:, :d1])
    assert close(text[0][:, d1:], full["text_embeds"][0][:, d1:])
    assert not close(text[0][:, :d1], full["text_embeds"][0][:, :d1])
    assert close(pooled[0], full["pooled_embeds"][0])
    # row 1: encoder 2 blanked, with its pooled embedding
    assert close(text[1][:, :d1], full["text_embeds"][1][:, :d1])
    assert close(text[1][:, d1:], empty["text_embeds"][0][:, d1:])
    assert close(pooled[1], empty["pooled_embeds"][0])
    assert not close(pooled[1], full["pooled_embeds"][1])
    # row 2: untouched
    assert close(text[2], full["text_embeds"][2]) and close(pooled[2], full["pooled_embeds"][2])


@pytest.mark.parametrize("arch", ["sd1", "example"])
def test_a_single_encoder_arch_blanks_the_whole_row(arch: str, sd1_dir: Path,
                                                    example_dir: Path) -> None:
    model = load_model(model_cfg(arch, sd1_dir if arch == "sd1" else example_dir))
    assert model.prompt_dropout_encoders == 1
    full = model.get_prompt_embeds(CAPTIONS)
    empty = model.get_prompt_embeds([""])
    out = model.get_prompt_embeds_dropped(CAPTIONS, ((True,), (False,), (True,)))
    assert out.keys() == full.keys()
    for key in full.keys():
        assert close(out[key][0], empty[key][0]) and close(out[key][2], empty[key][0])
        assert close(out[key][1], full[key][1])
    assert not close(out["text_embeds"][0], full["text_embeds"][0])
