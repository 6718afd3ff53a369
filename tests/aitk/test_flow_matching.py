"""Timestep sampling, the loss, and the non-finite check."""

from __future__ import annotations

import pytest
import torch

from aitk.diffusion.flow_matching import flow_matching_loss
from aitk.diffusion.noise import check_finite
from aitk.diffusion.timesteps import sample_timesteps
from aitk.errors import NonFiniteLoss


@pytest.mark.parametrize("kind", ["sigmoid", "logit_normal", "linear", "uniform"])
def test_timesteps_lie_inside_0_1000(kind):
    t = sample_timesteps(4096, torch.Generator().manual_seed(0), kind)
    assert t.dtype == torch.float32 and t.shape == (4096,)
    assert (t > 0).all() and (t < 1000).all()


def test_logit_normal_favours_the_middle_and_uniform_does_not():
    ln = sample_timesteps(20000, torch.Generator().manual_seed(0), "sigmoid")
    un = sample_timesteps(20000, torch.Generator().manual_seed(0), "uniform")
    mid = lambda t: ((t > 250) & (t < 750)).float().mean().item()  # noqa: E731
    assert mid(ln) > 0.7
    assert mid(un) == pytest.approx(0.5, abs=0.02)


def test_unknown_timestep_type_is_refused():
    with pytest.raises(ValueError, match="unknown timestep_type"):
        sample_timesteps(2, torch.Generator(), "karras")


def test_loss_is_float32_mse_even_for_bf16_inputs():
    pred = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)
    target = torch.tensor([[0.0, 0.0]], dtype=torch.bfloat16)
    loss = flow_matching_loss(pred, target)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(2.5)


def test_add_noise_and_target_follow_the_convention(tiny_model):
    clean, noise = torch.ones(2, 4, 2, 2), torch.zeros(2, 4, 2, 2)
    noisy = tiny_model.add_noise(clean, noise, torch.tensor([250.0, 1000.0]))
    assert torch.allclose(noisy[0], torch.full((4, 2, 2), 0.75))  # (1 - s) x0 + s noise
    assert torch.allclose(noisy[1], torch.zeros(4, 2, 2))  # 1000 is pure noise


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_loss_raises_naming_the_step(value):
    with pytest.raises(NonFiniteLoss, match="at step 12"):
        check_finite(torch.tensor(value), 12)
    assert check_finite(torch.tensor(0.5), 12) == 0.5
