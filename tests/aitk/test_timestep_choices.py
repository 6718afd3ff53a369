"""`timestep_type` lognorm_blend and next_sample, and `content_or_style`, as upstream
documents them (aitk.diffusion.timesteps)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from aitk.diffusion.ddpm import DDPMSchedule
from aitk.diffusion.flow_matching import FlowMatchSchedule
from aitk.diffusion.noise import NoiseSettings
from aitk.diffusion.timesteps import (
    BLEND_MAX,
    FlowShift,
    blend_cdf,
    blend_quantile,
    following_level,
    next_sample_table,
    sample_from_table,
    sample_sigmas,
)


def test_lognorm_blend_draws_upstreams_mixture():
    s = sample_sigmas(200_000, torch.Generator().manual_seed(0), "lognorm_blend")
    assert ((s > 0) & (s < 1)).all()
    # The empirical CDF is the mixture's: 3/4 of 1 - X/M (X log-normal, sigma 1/3),
    # 1/4 uniform.
    for level in (0.2, 0.5, 0.63, 0.8):
        x = BLEND_MAX * (1 - level)
        lognormal = 1 - 0.5 * (1 + math.erf(math.log(x) / (1 / 3) / math.sqrt(2)))
        expected = 0.75 * lognormal + 0.25 * level
        assert (s <= level).float().mean().item() == pytest.approx(expected, abs=0.005)
    # most of the mass near 1 - 1/M (the log-normal's median), as upstream's table
    assert abs(s.median().item() - (1 - 1 / BLEND_MAX)) < 0.08
    q = torch.linspace(0.01, 0.99, 50)
    assert torch.allclose(blend_cdf(blend_quantile(q)), q, atol=1e-5)


@pytest.mark.parametrize("kind", ["sigmoid", "uniform", "lognorm_blend"])
def test_content_leans_to_high_noise_and_style_to_low(kind):
    draws = {bias: sample_sigmas(20_000, torch.Generator().manual_seed(1), kind, bias)
             for bias in ("balanced", "content", "style")}
    assert draws["content"].mean() > draws["balanced"].mean() + 0.1
    assert draws["style"].mean() < draws["balanced"].mean() - 0.1
    if kind == "uniform":  # the cubic bias itself: s = 1 - u^3 and s = u^3
        assert draws["content"].mean().item() == pytest.approx(0.75, abs=0.01)
        assert draws["style"].mean().item() == pytest.approx(0.25, abs=0.01)


def test_content_or_style_reaches_the_schedules():
    clean = torch.zeros(4096, 4, 8, 8)
    high = FlowMatchSchedule(NoiseSettings(content_or_style="content"))
    low = FlowMatchSchedule(NoiseSettings(content_or_style="style"))
    gen = torch.Generator
    assert high.sample_timesteps(clean, gen().manual_seed(0)).mean() > 600
    assert low.sample_timesteps(clean, gen().manual_seed(0)).mean() < 400
    from diffusers import DDPMScheduler

    ddpm = DDPMSchedule(DDPMScheduler(), NoiseSettings(content_or_style="content"))
    t = ddpm.sample_timesteps(clean, gen().manual_seed(0))
    assert t.mean() > 700 and (t == t.round()).all() and t.max() <= 999


def test_next_sample_draws_from_a_short_shifted_schedule_and_steps_to_its_next_level():
    table = next_sample_table(8, FlowShift(shift=3.0), 0)
    plain = torch.linspace(1.0, 0.001, 8)
    assert torch.allclose(table, 3 * plain / (1 + 2 * plain), atol=1e-4)  # model shift
    t = sample_from_table(1000, torch.Generator().manual_seed(0), table)
    levels = (table * 1000).tolist()
    index = [levels.index(v) for v in t.tolist()]
    assert set(index) == set(range(6))  # never the last two levels: a next one exists
    following = following_level(t, table)
    assert [levels.index(v) for v in following.tolist()] == [i + 1 for i in index]
    schedule = FlowMatchSchedule(NoiseSettings(timestep_type="next_sample",
                                               next_sample_timesteps=8))
    drawn = schedule.sample_timesteps(torch.zeros(5, 4, 8, 8), torch.Generator())
    unshifted = (next_sample_table(8, None, 0) * 1000).tolist()
    assert all(v in unshifted[:6] for v in drawn.tolist())


def test_the_model_reads_the_new_train_keys(tiny_model):
    tiny_model.configure_training(SimpleNamespace(timestep_type="next_sample",
                                                  content_or_style="style",
                                                  next_sample_timesteps=5))
    settings = tiny_model.training_schedule.settings
    assert (settings.content_or_style, settings.next_sample_timesteps) == ("style", 5)


# min/max_denoising_steps index the 1000-step schedule from pure noise (index 0), as
# upstream's trainer does: index i is noise level 1 - i / 1000 of a linear schedule.
@pytest.mark.parametrize("bias", ["balanced", "content", "style"])
def test_denoising_steps_keep_every_flow_matching_draw_in_the_window(bias):
    clean = torch.zeros(20000, 4, 8, 8)
    schedule = FlowMatchSchedule(NoiseSettings(timestep_type="linear", content_or_style=bias,
                                               denoising_steps=(200, 499)))
    t = schedule.sample_timesteps(clean, torch.Generator().manual_seed(0))
    assert t.min() >= 1000 - 499 - 1 and t.max() <= 1000 - 200  # noise levels 0.5 .. 0.8
    assert t.max() - t.min() > 290  # the whole window, not one end of it
    # sigmoid: the same quantiles of its own distribution, shifted kinds: then shifted
    quantiles = torch.tensor([0.5, 0.8])
    edges = torch.sigmoid(math.sqrt(2.0) * torch.erfinv(2.0 * quantiles - 1.0)) * 1000
    sig = FlowMatchSchedule(NoiseSettings(timestep_type="sigmoid", denoising_steps=(200, 499)))
    t = sig.sample_timesteps(clean, torch.Generator().manual_seed(1))
    assert t.min() >= edges[0] - 0.01 and t.max() <= edges[1] + 0.01
    shifted = FlowMatchSchedule(NoiseSettings(timestep_type="shift",
                                              denoising_steps=(200, 499)),
                                FlowShift(shift=3.0))
    t = shifted.sample_timesteps(clean, torch.Generator().manual_seed(2)) / 1000
    assert t.min() >= 3 * 0.5 / (1 + 2 * 0.5) - 1e-4 and t.max() <= 3 * 0.8 / 2.6 + 1e-4


@pytest.mark.parametrize("bias", ["balanced", "content"])
def test_denoising_steps_keep_every_ddpm_step_in_the_window(bias):
    from diffusers import DDPMScheduler

    ddpm = DDPMSchedule(DDPMScheduler(), NoiseSettings(content_or_style=bias,
                                                       denoising_steps=(0, 249)))
    t = ddpm.sample_timesteps(torch.zeros(20000, 4, 8, 8), torch.Generator().manual_seed(0))
    # indices 0..249 from the noisy end of upstream's 999..0 schedule: steps 750..999
    assert (t == t.round()).all() and t.min() == 750 and t.max() == 999
    one = DDPMSchedule(DDPMScheduler(), NoiseSettings(denoising_steps=(500, 500)))
    assert set(one.sample_timesteps(torch.zeros(64, 4, 8, 8),
                                    torch.Generator()).tolist()) == {499.0}


def test_the_model_reads_the_denoising_window_from_the_config(tiny_model):
    from aitk.config.schema import TrainConfig
    from aitk.config.slider import SliderTrainConfig

    tiny_model.configure_training(TrainConfig(min_denoising_steps=10,
                                              max_denoising_steps=300))
    assert tiny_model.training_schedule.settings.denoising_steps == (10, 300)
    # a slider's max_denoising_steps counts its partial denoising: the window stays whole
    tiny_model.configure_training(SliderTrainConfig(max_denoising_steps=40))
    assert tiny_model.training_schedule.settings.denoising_steps == (0, 999)
    # upstream's example configs write 1000: clipped to the schedule, as upstream does
    assert TrainConfig(max_denoising_steps=1000).denoising_steps == (0, 999)
    with pytest.raises(ValueError, match="min_denoising_steps"):
        TrainConfig(min_denoising_steps=600, max_denoising_steps=500)
