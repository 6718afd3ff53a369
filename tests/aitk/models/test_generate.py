from __future__ import annotations

import numpy as np
import pytest
import torch

from aitk.adapters import AdapterNetwork
from aitk.errors import ModelError
from aitk.models.base import GenerateImageConfig

pytestmark = pytest.mark.slow


def configs(*seeds: int) -> list[GenerateImageConfig]:
    return [GenerateImageConfig(prompt="a red square", negative_prompt="blurry", width=64,
                                height=48, seed=s, guidance_scale=3.0, sample_steps=4)
            for s in seeds]


def pixels(images) -> list[np.ndarray]:
    return [np.asarray(im) for im in images]


def test_deterministic_per_seed(model) -> None:
    first = pixels(model.generate_images(configs(1, 2)))
    again = pixels(model.generate_images(configs(1, 2)))
    assert first[0].shape == (48, 64, 3)
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert not np.array_equal(first[0], first[1])


def test_each_prompt_embedded_once_and_pipeline_built_once(model, monkeypatch) -> None:
    prompts, pipelines = [], []
    real_embed, real_pipeline = model.get_prompt_embeds, model.get_generation_pipeline

    def spy_embed(batch, control_images=None):
        prompts.extend(batch)
        return real_embed(batch)

    def spy_pipeline():
        pipelines.append(1)
        return real_pipeline()

    monkeypatch.setattr(model, "get_prompt_embeds", spy_embed)
    monkeypatch.setattr(model, "get_generation_pipeline", spy_pipeline)
    model.generate_images(configs(1, 2, 3))
    assert sorted(prompts) == ["a red square", "blurry"]
    assert pipelines == [1]


def test_train_mode_and_grad_state_are_restored(model) -> None:
    model.model.train()
    model.generate_images(configs(1))
    assert model.model.training and all(m.training for m in model.model.modules())
    assert torch.is_grad_enabled()


def test_trained_lora_changes_the_samples(model, net_cfg) -> None:
    base = pixels(model.generate_images(configs(5)))[0]
    net = AdapterNetwork.attach(model, net_cfg())
    assert np.array_equal(pixels(model.generate_images(configs(5)))[0], base)
    with torch.no_grad():
        for p in net.trainable_parameters():
            p.add_(torch.full_like(p, 0.2))
    assert not np.array_equal(pixels(model.generate_images(configs(5)))[0], base)


def test_precomputed_embeds_replace_the_text_encoder(model) -> None:
    cached = model.encode_prompts(["a red square", "blurry"])
    expected = pixels(model.generate_images(configs(3)))[0]
    model.unload_text_encoder()
    with pytest.raises(ModelError, match="encode_prompts"):
        model.generate_images(configs(3))
    got = pixels(model.generate_images(configs(3), prompt_embeds=cached))[0]
    assert np.array_equal(got, expected)
