"""Noise schedules against hand-computed values: timestep shifts, DDPM targets, Min-SNR,
noise offset, per-item loss weights."""

from __future__ import annotations

import math

import pytest
import torch

from aitk.diffusion.ddpm import DDPMSchedule
from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSettings, diffusion_loss, sample_noise
from aitk.diffusion.timesteps import FlowShift, bell_weights, sample_sigmas, sample_timesteps

SDXL_SCHEDULER = {"_class_name": "EulerDiscreteScheduler", "num_train_timesteps": 1000,
                  "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
                  "prediction_type": "epsilon", "steps_offset": 1}


def test_fixed_shift_matches_the_sd3_formula():
    s = torch.tensor([0.1, 0.5, 0.9])
    shifted = FlowShift(shift=3.0).apply(s, image_seq_len=0)
    expected = [3 * v / (1 + 2 * v) for v in (0.1, 0.5, 0.9)]
    assert shifted.tolist() == pytest.approx(expected)
    assert FlowShift().apply(s, 0).tolist() == pytest.approx(s.tolist())


def test_flux_dynamic_shift_interpolates_mu_over_image_tokens():
    flux = FlowShift(dynamic=True, base_shift=0.5, max_shift=1.15, base_seq_len=256,
                     max_seq_len=4096)
    assert flux.mu(256) == pytest.approx(0.5)
    assert flux.mu(4096) == pytest.approx(1.15)
    assert flux.mu(1024) == pytest.approx(0.5 + 0.65 * 768 / 3840)
    # 1024 px Flux: 128x128 latents packed 2x2 -> 4096 tokens; s = 0.5 -> e^mu / (e^mu + 1)
    half = flux.apply(torch.tensor([0.5]), 4096).item()
    assert half == pytest.approx(math.exp(1.15) / (math.exp(1.15) + 1.0))
    assert image_tokens(2)(torch.zeros(1, 16, 128, 128)) == 4096


def test_qwen_image_exponential_shift_from_its_scheduler_config():
    qwen = FlowShift.from_scheduler_config({
        "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9,
        "base_image_seq_len": 256, "max_image_seq_len": 8192,
        "time_shift_type": "exponential", "shift_terminal": 0.02, "shift": 1.0})
    assert qwen.dynamic and qwen.exponential
    mu = 0.5 + 0.4 * (4096 - 256) / (8192 - 256)
    s = torch.tensor([0.25])
    assert qwen.apply(s, 4096).item() == pytest.approx(math.exp(mu) / (math.exp(mu) + 3.0))
    linear = FlowShift(dynamic=True, exponential=False)
    assert linear.apply(s, 256).item() == pytest.approx(0.5 / (0.5 + 3.0))


def test_shift_applies_only_to_the_shifted_timestep_types():
    shift = FlowShift(shift=3.0)
    plain = sample_timesteps(64, torch.Generator().manual_seed(1), "uniform", shift, 0)
    shifted = sample_timesteps(64, torch.Generator().manual_seed(1), "shift", shift, 0)
    base = sample_sigmas(64, torch.Generator().manual_seed(1), "uniform")
    assert plain.tolist() == pytest.approx((base * 1000).tolist())
    assert shifted.tolist() == pytest.approx((shift.apply(base, 0) * 1000).tolist(), rel=1e-5)
    assert shifted.mean() > plain.mean()  # toward the noisy end


def test_every_timestep_type_draws_inside_the_open_range():
    for kind in ("sigmoid", "logit_normal", "linear", "uniform", "weighted", "shift",
                 "flux_shift"):
        t = sample_timesteps(512, torch.Generator().manual_seed(0), kind,
                             FlowShift(shift=3.0), 0)
        assert t.shape == (512,) and (t > 0).all() and (t < 1000).all(), kind


def test_weighted_type_weighs_the_middle_and_averages_one():
    w = bell_weights(torch.linspace(0, 1000, 100001))
    assert w.mean().item() == pytest.approx(1.0, rel=1e-3)
    assert bell_weights(torch.tensor([500.0])) > bell_weights(torch.tensor([50.0]))
    sched = FlowMatchSchedule(NoiseSettings(timestep_type="weighted"))
    assert sched.loss_weights(torch.tensor([500.0])) is not None
    assert FlowMatchSchedule(NoiseSettings()).loss_weights(torch.tensor([500.0])) is None


def test_flow_match_schedule_uses_the_latent_size_for_its_shift():
    flux = FlowShift(dynamic=True)
    sched = FlowMatchSchedule(NoiseSettings(timestep_type="flux_shift"), flux, image_tokens(2))
    small = sched.sample_timesteps(torch.zeros(256, 16, 32, 32), torch.Generator().manual_seed(0))
    large = sched.sample_timesteps(torch.zeros(256, 16, 128, 128),
                                   torch.Generator().manual_seed(0))
    assert (large > small).all()  # same draws, more tokens -> more noise


def test_ddpm_epsilon_and_v_targets_match_hand_computed_values():
    settings = NoiseSettings()
    eps = DDPMSchedule.from_config(SDXL_SCHEDULER, settings)
    v = DDPMSchedule.from_config(SDXL_SCHEDULER, settings, prediction_type="v_prediction")
    clean, noise = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    t = torch.tensor([10.0, 900.0])
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    abar = torch.cumprod(1 - betas, 0)[[10, 900]].float().view(-1, 1, 1, 1)
    expected_noisy = abar.sqrt() * clean + (1 - abar).sqrt() * noise
    assert torch.allclose(eps.add_noise(clean, noise, t), expected_noisy, atol=1e-5)
    assert torch.equal(eps.target(clean, noise, t), noise)
    expected_v = abar.sqrt() * noise - (1 - abar).sqrt() * clean
    assert torch.allclose(v.target(clean, noise, t), expected_v, atol=1e-5)
    drawn = eps.sample_timesteps(clean, torch.Generator().manual_seed(0))
    assert drawn.dtype == torch.float32 and torch.equal(drawn, drawn.round())
    assert ((drawn >= 0) & (drawn <= 999)).all()


def test_min_snr_gamma_weights():
    eps = DDPMSchedule.from_config(SDXL_SCHEDULER, NoiseSettings(min_snr_gamma=5.0))
    v = DDPMSchedule.from_config(SDXL_SCHEDULER, NoiseSettings(min_snr_gamma=5.0),
                                 prediction_type="v_prediction")
    t = torch.tensor([1.0, 999.0])
    snr = eps.snr(t)
    assert snr[0] > 5.0 > snr[1]
    assert eps.loss_weights(t).tolist() == pytest.approx([5.0 / snr[0].item(), 1.0])
    assert v.loss_weights(t).tolist() == pytest.approx(
        [5.0 / (snr[0].item() + 1), snr[1].item() / (snr[1].item() + 1)])
    assert DDPMSchedule.from_config(SDXL_SCHEDULER, NoiseSettings()).loss_weights(t) is None


def test_snr_gamma_weights_by_gamma_over_snr_and_wins_over_min_snr_gamma():
    """Upstream's `snr_gamma` (apply_snr_weight fixed=True): gamma / SNR, unclipped, for
    epsilon and v alike; it is checked before min_snr_gamma."""
    t = torch.tensor([1.0, 500.0, 999.0])
    for prediction in (None, "v_prediction"):
        fixed = DDPMSchedule.from_config(SDXL_SCHEDULER, NoiseSettings(
            snr_gamma=5.0, min_snr_gamma=1.0), prediction_type=prediction)
        snr = fixed.snr(t)
        assert fixed.loss_weights(t).tolist() == pytest.approx((5.0 / snr).tolist())
    assert fixed.loss_weights(t)[2] > 1.0  # not clipped at 1 the way Min-SNR is
    flow = FlowMatchSchedule(NoiseSettings(snr_gamma=5.0))
    assert flow.loss_weights(t) is None  # DDPM archs only, as min_snr_gamma


def test_the_model_reads_snr_gamma(tiny_model):
    from aitk.config.schema import TrainConfig

    tiny_model.configure_training(TrainConfig(snr_gamma=5.0))
    assert tiny_model.training_schedule.settings.snr_gamma == 5.0


def test_noise_offset_adds_one_value_per_item_and_channel():
    clean = torch.zeros(2, 3, 4, 4)
    plain = sample_noise(clean, torch.Generator().manual_seed(0))
    offset = sample_noise(clean, torch.Generator().manual_seed(0), noise_offset=0.5)
    diff = offset - plain  # the same base draw, then the offset
    assert diff.abs().sum() > 0
    assert torch.allclose(diff, diff[:, :, :1, :1].expand_as(diff))


def test_weighted_loss_is_a_weighted_mean_of_item_errors():
    pred, target = torch.zeros(2, 1, 2, 2), torch.ones(2, 1, 2, 2)
    target[1] *= 2  # item errors 1 and 4
    assert diffusion_loss(pred, target).item() == pytest.approx(2.5)
    weighted = diffusion_loss(pred, target, torch.tensor([1.0, 0.5]))
    assert weighted.item() == pytest.approx((1 * 1 + 4 * 0.5) / 2)
