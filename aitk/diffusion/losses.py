"""`train.loss_type`: how far a prediction is from its target, element by element, and
the one reduction every loss term shares.

- `mse`: (pred - target)^2.
- `mae`: |pred - target|.
- `pseudo_huber`: sqrt((pred - target)^2 + c^2) - c with upstream's c = 0.01: squared
  for small errors, absolute for large ones, so outliers pull less than under mse.
- `wavelet`: the squared error in a one-level Haar wavelet basis (ptwt, zero padding),
  low band and the three detail bands side by side. Upstream scores DWT(noise - pred)
  against DWT(clean); the DWT is linear, so that is DWT(target - pred) for a velocity
  target, which is what is scored here (for any target). The orthonormal Haar basis
  keeps the squared error's sum (Parseval), so on even latent sides its mean equals
  `mse`'s; with odd sides the padded coefficients lower it slightly.
- `stepped`: the prediction steps the noisy latents STEPPED_DELTA closer to clean
  (upstream: 50 of its 1000 training levels), the clean latents are recovered from
  there with the known noise, and their squared error is scored, times 10 (upstream's
  factor, so the learning rate behaves as with mse). It weighs an item's velocity error
  by ((s - s') / (1 - s'))^2: little at high noise, where one step cannot go far.
  Needs a schedule that can say which clean latents a prediction implies
  (`predicted_clean`: flow matching).

Every loss is computed in float32, whatever dtype the model ran in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aitk.config.choices import LOSS_TYPES

PSEUDO_HUBER_C = 0.01
STEPPED_DELTA = 0.05
STEPPED_SCALE = 10.0


@dataclass(frozen=True)
class Noised:
    """One micro-step's draws (what `stepped` reads besides pred and target)."""

    clean: torch.Tensor
    noise: torch.Tensor
    timesteps: torch.Tensor
    noisy: torch.Tensor


def haar_bands(x: torch.Tensor) -> torch.Tensor:
    """One-level 2-D Haar DWT over the last two axes (ptwt; zero padding for odd sides):
    (B, C, ..., h, w) -> (B, 4C, ..., ceil(h/2), ceil(w/2)), low band then details."""
    import ptwt
    import pywt

    low, (horizontal, vertical, diagonal) = ptwt.wavedec2(
        x.float(), pywt.Wavelet("haar"), level=1, mode="zero")
    return torch.cat([low, horizontal, vertical, diagonal], dim=1)


def band_weights(weights: torch.Tensor) -> torch.Tensor:
    """Per-element weights on the latent grid -> on `haar_bands`' grid (each coefficient
    gets the mean weight of the 2x2 cell it summarises, for all four bands)."""
    flat = weights.flatten(0, -3) if weights.ndim > 4 else weights
    pooled = F.avg_pool2d(flat.float(), 2, ceil_mode=True)
    pooled = pooled.view(*weights.shape[:-2], *pooled.shape[-2:])
    return torch.cat([pooled] * 4, dim=1)


def stepped_clean(pred: torch.Tensor, x: Noised, predicted_clean: Callable
                  ) -> torch.Tensor:
    """`stepped`: the clean latents recovered after one STEPPED_DELTA step."""
    s = (x.timesteps.float() / 1000.0).view(-1, *([1] * (pred.ndim - 1)))
    s_next = (s - STEPPED_DELTA).clamp_min(0.0)
    clean_hat = predicted_clean(x.noisy, pred, x.timesteps)
    noise_hat = (x.noisy.float() - (1.0 - s) * clean_hat) / s
    stepped = (1.0 - s_next) * clean_hat + s_next * noise_hat
    return (stepped - s_next * x.noise.float()) / (1.0 - s_next)


def elementwise(kind: str, pred: torch.Tensor, target: torch.Tensor,
                x: Noised | None = None, predicted_clean: Callable | None = None
                ) -> torch.Tensor:
    """The per-element loss of `kind` (float32). `wavelet` returns `haar_bands`' layout;
    `stepped` needs the draws `x` and the schedule's `predicted_clean`."""
    pred, target = pred.float(), target.float()
    if kind == "mse":
        return (pred - target).pow(2)
    if kind == "mae":
        return (pred - target).abs()
    if kind == "pseudo_huber":
        return torch.sqrt((pred - target).pow(2) + PSEUDO_HUBER_C ** 2) - PSEUDO_HUBER_C
    if kind == "wavelet":
        return haar_bands(pred - target).pow(2)
    if kind == "stepped":
        if x is None or predicted_clean is None:
            raise ValueError("loss_type stepped needs the step's draws and the schedule's "
                             "predicted_clean")
        return (stepped_clean(pred, x, predicted_clean) - x.clean.float()).pow(2) \
            * STEPPED_SCALE
    raise ValueError(f"unknown loss_type {kind!r}; use one of {', '.join(LOSS_TYPES)}")


def reduce(per_element: torch.Tensor, weights: torch.Tensor | None = None,
           item_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted per-element loss -> each item's mean -> weighted per item -> the batch
    mean. `weights` broadcast against the elements (a mask); `item_weights` are (B,)."""
    if weights is not None:
        per_element = per_element * weights.to(per_element.device, torch.float32)
    per_item = per_element.flatten(1).mean(1)
    if item_weights is not None:
        per_item = per_item * item_weights.to(per_item.device, torch.float32)
    return per_item.mean()


def diffusion_loss(kind: str, pred: torch.Tensor, target: torch.Tensor,
                   x: Noised | None = None, *, weights: torch.Tensor | None = None,
                   item_weights: torch.Tensor | None = None,
                   predicted_clean: Callable | None = None) -> torch.Tensor:
    """`elementwise` then `reduce`; the weights follow a wavelet loss into its bands."""
    per_element = elementwise(kind, pred, target, x, predicted_clean)
    if weights is not None and kind == "wavelet":
        weights = band_weights(weights.expand(pred.shape) if weights.shape != pred.shape
                               else weights)
    return reduce(per_element, weights, item_weights)
