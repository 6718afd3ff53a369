"""Sliders on the example arch, in process: the LoRA at -1 moves the model the other way
than at +1 (in pictures on the shipped pre-trained base, and in predictions for upstream's
prompt-pair slider), the targets follow the concept-slider rule, and a slider run that
makes its own latents resumes exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters.hooks import LoraHooks
from aitk.config.loading import load_config
from aitk.errors import EXIT_OK
from aitk.models.base import GenerateImageConfig
from aitk.models.registry import load_model
from aitk.run.job import run_job
from aitk.run.slider import expanded_targets, norm_like, slider_targets
from tests.aitk.aitk_testing import REPO, job_config, write_config
from tests.aitk.models.conftest import ModelCfg

BASE = REPO / "aitk" / "models" / "example" / "base"  # draws the shapes a caption names


def test_targets_go_both_ways_from_the_neutral():
    neutral, pos, neg = torch.zeros(4), torch.tensor([1.0, 0, 0, 0]), torch.zeros(4)
    plus, minus = slider_targets(neutral, pos, neg, 3.0)
    assert torch.equal(plus, torch.tensor([3.0, 0, 0, 0])) and torch.equal(minus, -plus)
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0])
    scaled = norm_like(torch.tensor([10.0, 0.0, 5.0, 1.0]), ref)
    assert torch.allclose(scaled.mean(), ref.mean()) and torch.allclose(scaled.std(), ref.std())


def test_shuffled_targets_are_seeded_orders_of_their_parts():
    from aitk.config.slider import SliderTarget

    target = SliderTarget(positive="a, b, c", negative="x, y", shuffle=True)
    first, again = expanded_targets([target], 1), expanded_targets([target], 1)
    assert [t.positive for t in first] == [t.positive for t in again]
    assert len(first) > 1 and all(sorted(t.positive.split(", ")) == ["a", "b", "c"]
                                  for t in first)


def greenness(image) -> float:
    a = np.asarray(image.convert("RGB"), dtype=np.float64)
    return float(a[..., 1].mean() - a[..., 2].mean())


@pytest.mark.skipif(not BASE.is_dir(), reason="the shipped example base is absent")
def test_a_concept_slider_at_minus_one_moves_the_picture_the_other_way(tmp_path):
    cfg = job_config("cs", tmp_path / "out", BASE, steps=20,
                     sample={"sample_every": 20, "prompts": ["a square --m -1",
                                                            "a square --m 1"],
                             "walk_seed": False})
    proc = cfg["config"]["process"][0]
    proc["type"] = "concept_slider"
    proc["slider"] = {"target_class": "a square", "positive_prompt": "a green square",
                      "negative_prompt": "a blue square", "guidance_strength": 3.0,
                      "anchor_class": ""}
    assert run_job(load_config(str(write_config(tmp_path / "cs.yml", cfg)))) == EXIT_OK
    lora = tmp_path / "out" / "cs" / "cs.safetensors"
    model = load_model(ModelCfg(name_or_path=str(BASE)))
    # Green minus blue, averaged over 8 seeds (one picture may saturate).
    configs = [GenerateImageConfig("a square", width=32, height=32, seed=s, sample_steps=4)
               for s in range(8)]
    with LoraHooks(model, [(lora, 1.0)]) as hooks:
        shades = {}
        for weight in (-1.0, 0.0, 1.0):
            hooks.set_multiplier(weight)
            shades[weight] = np.mean([greenness(i) for i in model.generate_images(configs)])
    # measured: about -67 / -19 / +36
    assert shades[-1.0] + 20 < shades[0.0] < shades[1.0] - 20, shades
    # The trainer's previews at --m -1 / --m 1, written by the run itself.
    assert sorted(p.name for p in (tmp_path / "out" / "cs" / "samples").iterdir()) == [
        "000000000_0.png", "000000000_1.png", "000000020_0.png", "000000020_1.png"]


def slider_job(root: Path, model: Path, steps: int) -> Path:
    config = {"job": "train", "config": {
        "name": "sl", "training_folder": str(root / "out"), "device": "cpu",
        "process": [{
            "type": "slider",
            "network": {"type": "lierla", "linear": 4, "linear_alpha": 4},
            "train": {"steps": steps, "lr": 5e-3, "max_denoising_steps": 6,
                      "gradient_checkpointing": True, "seed": 5},
            "model": {"name_or_path": str(model), "is_v2": False},
            "save": {"dtype": "float32", "save_every": 2, "max_step_saves_to_keep": 1},
            "sample": {"sample_every": 100, "prompts": ["a square --m -2"],
                       "width": 32, "height": 32, "sample_steps": 2},
            "slider": {"resolutions": [[32, 32], [48, 32]], "targets": [
                {"target_class": "a square", "positive": "red, bright",
                 "negative": "blue, dark", "shuffle": True}],
                "anchors": [{"prompt": "a dog", "multiplier": 0.5}]}}]}}
    return write_config(root / "sl.yml", config)


@pytest.fixture(scope="module")
def trained_slider(tmp_path_factory, example_model_dir):
    root = tmp_path_factory.mktemp("slider")
    loaded = load_config(str(slider_job(root, example_model_dir, 8)))
    assert loaded.job.output_dir() == root / "out" / "sl"  # the job-level folder
    assert run_job(loaded) == EXIT_OK
    return root / "out" / "sl" / "sl.safetensors"


def test_the_prompt_pair_slider_moves_the_prediction_both_ways(example_model_dir,
                                                                trained_slider):
    model = load_model(ModelCfg(name_or_path=str(example_model_dir)))
    gen = torch.Generator().manual_seed(1)
    x, t = torch.randn(4, 4, 8, 8, generator=gen), torch.tensor([200.0, 400, 600, 800])
    embeds = model.encode_prompts(["a square", "red, bright", "blue, dark"])
    e = {k: v.expand_to_batch(4) for k, v in embeds.items()}
    with torch.no_grad(), LoraHooks(model, [(trained_slider, 1.0)]) as hooks:
        hooks.set_multiplier(0.0)
        neutral = model.get_noise_prediction(x, t, e["a square"])
        direction = (model.get_noise_prediction(x, t, e["red, bright"])
                     - model.get_noise_prediction(x, t, e["blue, dark"])).flatten()
        moved = {}
        for weight in (-1.0, 1.0):
            hooks.set_multiplier(weight)
            effect = model.get_noise_prediction(x, t, e["a square"]) - neutral
            moved[weight] = float(effect.flatten() @ direction)
    assert moved[1.0] > 0 > moved[-1.0], moved


def test_a_slider_that_makes_its_own_latents_resumes_exactly(tmp_path, example_model_dir,
                                                              trained_slider):
    assert run_job(load_config(str(slider_job(tmp_path, example_model_dir, 4)))) == EXIT_OK
    assert run_job(load_config(str(slider_job(tmp_path, example_model_dir, 8)))) == EXIT_OK
    got = load_file(tmp_path / "out" / "sl" / "sl.safetensors")
    want = load_file(trained_slider)
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in got) <= 1e-6
