"""What a training step draws and how it is scored: the noise schedule behind the model.

The loop uses the model's one `NoiseSchedule` (`model.training_schedule`, built by
`BaseModel.make_training_schedule`) for every micro-step:

    noise   = schedule.sample_noise(clean, generator)       # + noise_offset
    t       = schedule.sample_timesteps(clean, generator)   # (B,) on 0..1000
    noisy   = model.add_noise(clean, noise, t)              # schedule.add_noise
    target  = model.get_loss_target(..., timesteps=t)       # schedule.target
    loss    = diffusion_loss(pred, target, schedule.loss_weights(t))

Two schedules exist: flow matching (aitk.diffusion.flow_matching; Flux, Qwen-Image, the example)
and DDPM (aitk.diffusion.ddpm; SDXL, epsilon or v-prediction). Draws come only from the generator
passed in, in a fixed order (noise, then the offset, then timesteps), so a step's draws
depend on (seed, step, micro-step) alone and resume is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from aitk.errors import NonFiniteLoss


@dataclass(frozen=True)
class NoiseSettings:
    """The job's `train:` keys that shape the noise (aitk.config.schema.TrainConfig)."""

    timestep_type: str = "sigmoid"
    noise_offset: float = 0.0
    min_snr_gamma: float | None = None
    snr_gamma: float | None = None  # upstream's fixed gamma / SNR weight (wins over min)
    content_or_style: str = "balanced"  # which end of the noise range items lean to
    next_sample_timesteps: int = 8  # `next_sample`: levels of its short schedule
    # min/max_denoising_steps: the window of the 1000-step schedule trained on, counted
    # from pure noise (aitk.diffusion.timesteps.step_window); `next_sample` ignores it.
    denoising_steps: tuple[int, int] = (0, 999)


class NoiseSchedule(Protocol):
    settings: NoiseSettings

    def sample_noise(self, clean: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        ...

    def sample_timesteps(self, clean: torch.Tensor, generator: torch.Generator
                         ) -> torch.Tensor:
        ...

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor,
                  timesteps: torch.Tensor) -> torch.Tensor:
        ...

    def target(self, clean: torch.Tensor, noise: torch.Tensor,
               timesteps: torch.Tensor) -> torch.Tensor:
        ...

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        ...

    def timesteps_at(self, sigmas: torch.Tensor) -> torch.Tensor:
        """Noise levels in [0, 1] as this schedule's timesteps (validation's fixed
        levels)."""
        ...

    def denoise_step(self, noisy: torch.Tensor, pred: torch.Tensor, timesteps: torch.Tensor,
                     next_timesteps: torch.Tensor) -> torch.Tensor:
        """One deterministic sampling step from `timesteps` to `next_timesteps` (lower),
        given the model's prediction: what a slider's latents are made with."""
        ...


def sample_noise(clean: torch.Tensor, generator: torch.Generator,
                 noise_offset: float = 0.0) -> torch.Tensor:
    """Gaussian noise shaped like `clean`, drawn on the CPU generator (the same numbers
    on every device), plus `noise_offset` times one N(0, 1) value per item and channel:
    that lets a model learn to shift a whole image's brightness (very dark or light
    images), which zero-mean noise alone almost never asks of it."""
    noise = torch.randn(clean.shape, generator=generator)
    if noise_offset:
        shape = (*clean.shape[:2], *([1] * (clean.ndim - 2)))
        noise = noise + noise_offset * torch.randn(shape, generator=generator)
    return noise.to(clean.device, clean.dtype)


def diffusion_loss(pred: torch.Tensor, target: torch.Tensor,
                   weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error in float32, whatever dtype the model ran in; with `weights`
    (B,), each item's mean error is weighted before the batch mean."""
    if weights is None:
        return torch.nn.functional.mse_loss(pred.float(), target.float())
    per_item = (pred.float() - target.float()).pow(2).flatten(1).mean(1)
    return (per_item * weights.to(per_item.device, torch.float32)).mean()


def check_finite(loss: torch.Tensor | float, step: int) -> float:
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    if not math.isfinite(value):
        raise NonFiniteLoss(step, value)
    return value
