"""Preview images: fixed prompts and seeds, names with the step, atomic writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from aitk.config import SampleConfig, SampleItem
from aitk.sampling import image_configs, write_samples


def test_configs_follow_seed_walk_trigger_and_per_item_overrides():
    cfg = SampleConfig(prompts=["[trigger] a cat", "a dog"], seed=10, walk_seed=True,
                       width=64, height=32, guidance_scale=2.0, sample_steps=3, neg="blurry")
    out = image_configs(cfg, "sks")
    assert [c.prompt for c in out] == ["sks a cat", "a dog"]
    assert [c.seed for c in out] == [10, 11]
    assert (out[0].width, out[0].height, out[0].sample_steps) == (64, 32, 3)
    assert out[0].negative_prompt == "blurry"
    fixed = SampleConfig(samples=[SampleItem(prompt="x", seed=99, width=16), SampleItem(
        prompt="y")], seed=5, walk_seed=False)
    got = image_configs(fixed, None)
    assert [(c.seed, c.width) for c in got] == [(99, 16), (5, 512)]


def test_samples_are_written_with_the_step_and_leave_global_rng_alone(tiny_model,
                                                                      tmp_path: Path):
    configs = image_configs(SampleConfig(prompts=["a", "b"], width=16, height=16,
                                         sample_steps=2, walk_seed=True), None)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    paths = write_samples(tiny_model, configs, tmp_path / "samples", 250, "png")
    assert torch.equal(torch.rand(1), expected_next)
    assert [p.name for p in paths] == ["000000250_0.png", "000000250_1.png"]
    again = write_samples(tiny_model, configs, tmp_path / "again", 250, "png")
    a, b = (np.asarray(Image.open(p)) for p in (paths[0], again[0]))
    assert np.array_equal(a, b)  # same prompt + seed, same image
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "000000250_0.png", "000000250_1.png"]  # no temp files left
