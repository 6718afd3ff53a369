"""`train.loss_type`: each loss equals its formula on a fixed batch (aitk.diffusion.losses)."""

from __future__ import annotations

import math

import pytest
import torch

from aitk.diffusion import losses
from aitk.diffusion.flow_matching import FlowMatchSchedule, add_noise
from aitk.diffusion.losses import Noised


def fixed(shape=(2, 4, 6, 8), seed=0):
    gen = torch.Generator().manual_seed(seed)
    clean, noise, pred = (torch.randn(shape, generator=gen) for _ in range(3))
    timesteps = torch.tensor([300.0, 800.0])
    noisy = add_noise(clean, noise, timesteps)
    return pred, noise - clean, Noised(clean, noise, timesteps, noisy)


def by_hand_haar(x: torch.Tensor) -> torch.Tensor:
    """One-level orthonormal Haar bands of even-sided x, from the 2x2 cells."""
    a, b = x[..., 0::2, 0::2], x[..., 0::2, 1::2]
    c, d = x[..., 1::2, 0::2], x[..., 1::2, 1::2]
    return torch.cat([(a + b + c + d) / 2, (a + b - c - d) / 2, (a - b + c - d) / 2,
                      (a - b - c + d) / 2], dim=1)


def test_mse_mae_and_pseudo_huber_are_their_formulas():
    pred, target, x = fixed()
    err = pred - target
    assert losses.diffusion_loss("mse", pred, target, x).item() == \
        pytest.approx(err.pow(2).mean().item(), rel=1e-6)
    assert losses.diffusion_loss("mae", pred, target, x).item() == \
        pytest.approx(err.abs().mean().item(), rel=1e-6)
    c = 0.01  # upstream's constant
    huber = (torch.sqrt(err ** 2 + c ** 2) - c).mean()
    assert losses.diffusion_loss("pseudo_huber", pred, target, x).item() == \
        pytest.approx(huber.item(), rel=1e-6)


def test_wavelet_is_the_squared_error_of_the_haar_bands():
    pred, target, x = fixed()
    # Upstream's formula: DWT(noise - pred) against DWT(clean), for a velocity target.
    upstream = (by_hand_haar(x.noise - pred) - by_hand_haar(x.clean)).pow(2).mean()
    ours = losses.diffusion_loss("wavelet", pred, target, x)
    assert ours.item() == pytest.approx(upstream.item(), rel=1e-5)
    # The orthonormal basis keeps the squared error (Parseval): on even sides it is mse.
    assert ours.item() == pytest.approx((pred - target).pow(2).mean().item(), rel=1e-5)
    # Odd sides are zero-padded: the same total error over more coefficients.
    pred5, target5, x5 = fixed((2, 4, 5, 7))
    odd = losses.diffusion_loss("wavelet", pred5, target5, x5)
    total = (pred5 - target5).pow(2).sum() / (2 * 4 * 4 * 3 * 4)  # 4 bands of 3x4
    assert odd.item() == pytest.approx(total.item(), rel=1e-5)


def test_stepped_recovers_the_clean_latents_one_step_ahead_as_upstream():
    pred, target, x = fixed()
    schedule = FlowMatchSchedule()
    ours = losses.diffusion_loss("stepped", pred, target, x,
                                 predicted_clean=schedule.predicted_clean)
    # Upstream (toolkit/util/losses.py): step sigma -> sigma - 0.05 along the
    # prediction, recover the clean sample with the known noise, mse, times 10.
    s = (x.timesteps / 1000).view(-1, 1, 1, 1)
    s_next = s - 0.05
    stepped = x.noisy + (s_next - s) * pred
    recovered = (stepped - s_next * x.noise) / (1 - s_next)
    expected = (recovered - x.clean).pow(2).mean() * 10
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)
    # Equivalently a per-item weight on the velocity error.
    weight = ((s - s_next) / (1 - s_next)) ** 2
    assert ours.item() == pytest.approx(((pred - target) ** 2 * weight).mean().item() * 10,
                                        rel=1e-4)


def test_stepped_at_the_clean_end_scores_the_clean_estimate():
    pred, target, x = fixed()
    x = Noised(x.clean, x.noise, torch.tensor([20.0, 40.0]), x.noisy)  # s < 0.05
    loss = losses.diffusion_loss("stepped", pred, target, x,
                                 predicted_clean=FlowMatchSchedule().predicted_clean)
    s = (x.timesteps / 1000).view(-1, 1, 1, 1)
    clean_hat = x.noisy - s * pred
    assert loss.item() == pytest.approx(((clean_hat - x.clean) ** 2).mean().item() * 10,
                                        rel=1e-5)
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("kind", ["mse", "mae", "pseudo_huber", "wavelet"])
def test_weights_leave_out_what_they_zero(kind):
    pred, target, x = fixed()
    pred.requires_grad_(True)
    weights = torch.ones(2, 1, 6, 8)
    weights[..., :4] = 0.0  # the left half of every latent (2x2-cell aligned)
    losses.diffusion_loss(kind, pred, target, x, weights=weights).backward()
    assert pred.grad is not None
    assert pred.grad[..., :4].abs().max() == 0
    assert pred.grad[..., 4:].abs().min() > 0


def test_item_weights_scale_each_items_mean():
    pred, target, x = fixed()
    per_item = (pred - target).pow(2).flatten(1).mean(1)
    weighted = losses.diffusion_loss("mse", pred, target, x,
                                     item_weights=torch.tensor([2.0, 0.5]))
    assert weighted.item() == pytest.approx(((per_item * torch.tensor([2.0, 0.5])).mean())
                                            .item(), rel=1e-6)


def test_an_unknown_loss_type_names_the_choices():
    pred, target, x = fixed()
    with pytest.raises(ValueError, match="mse, mae, pseudo_huber, wavelet, stepped"):
        losses.diffusion_loss("l3", pred, target, x)
