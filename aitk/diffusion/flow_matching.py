"""Flow matching, the way the math reads (diffusers' dreambooth flux script has the same
shape): s from a sampled u, input (1 - s) x0 + s noise, target noise - x0.

Timesteps cross the model API on 0..1000 where 1000 is pure noise (s = t / 1000).
Randomness comes only from the generator passed in, so a step's draws depend on the
seed and the step, never on what ran before (exact resume needs that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from aitk.diffusion.noise import NoiseSettings, diffusion_loss, sample_noise
from aitk.diffusion.timesteps import (
    FlowShift,
    bell_weights,
    following_level,
    next_sample_table,
    sample_from_table,
    sample_timesteps,
)


def add_noise(clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor
              ) -> torch.Tensor:
    """x_t = (1 - s) * clean + s * noise, s = t / 1000 per item (float32 math)."""
    s = (timesteps.to(torch.float32) / 1000.0).view(-1, *([1] * (clean.ndim - 1)))
    return ((1.0 - s) * clean.float() + s * noise.float()).to(clean.dtype)


def velocity_target(clean: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The velocity from data to noise: d x_t / d s = noise - clean."""
    return noise - clean


def euler_step(noisy: torch.Tensor, velocity: torch.Tensor, timesteps: torch.Tensor,
               next_timesteps: torch.Tensor) -> torch.Tensor:
    """x_next = x + (s_next - s) * v with s = t / 1000 (per item, float32 math)."""
    shape = (-1, *([1] * (noisy.ndim - 1)))
    ds = ((next_timesteps.float() - timesteps.float()) / 1000.0).view(shape)
    return (noisy.float() + ds.to(noisy.device) * velocity.float()).to(noisy.dtype)


def flow_matching_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error in float32, whatever dtype the model ran in."""
    return diffusion_loss(pred, target)


def image_tokens(patch_size: int) -> Callable[[torch.Tensor], int]:
    """Latents (B, C, [F,] h, w) -> the transformer's image sequence length."""
    def count(latents: torch.Tensor) -> int:
        h, w = latents.shape[-2:]
        frames = latents.shape[2] if latents.ndim == 5 else 1
        return frames * (h // patch_size) * (w // patch_size)

    return count


@dataclass(frozen=True)
class FlowMatchSchedule:
    """Flow matching with the model's timestep shift (see aitk.diffusion.timesteps)."""

    settings: NoiseSettings = NoiseSettings()
    shift: FlowShift = FlowShift()
    seq_len: Callable[[torch.Tensor], int] = field(default=image_tokens(1))

    def sample_noise(self, clean: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return sample_noise(clean, generator, self.settings.noise_offset)

    def sample_timesteps(self, clean: torch.Tensor, generator: torch.Generator
                         ) -> torch.Tensor:
        st = self.settings
        if st.timestep_type == "next_sample":
            return sample_from_table(clean.shape[0], generator,
                                     self.next_sample_table(clean)).to(clean.device)
        t = sample_timesteps(clean.shape[0], generator, st.timestep_type, self.shift,
                             self.seq_len(clean), st.content_or_style, st.denoising_steps)
        return t.to(clean.device)

    def next_sample_table(self, clean: torch.Tensor) -> torch.Tensor:
        """`next_sample`'s short schedule (noise levels, descending) for these latents."""
        return next_sample_table(self.settings.next_sample_timesteps, self.shift,
                                 self.seq_len(clean))

    def next_timesteps(self, clean: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """`next_sample`: the level after each of `timesteps` in the short schedule."""
        return following_level(timesteps, self.next_sample_table(clean))

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor,
                  timesteps: torch.Tensor) -> torch.Tensor:
        return add_noise(clean, noise, timesteps)

    def target(self, clean: torch.Tensor, noise: torch.Tensor,
               timesteps: torch.Tensor) -> torch.Tensor:
        return velocity_target(clean, noise)

    def predicted_clean(self, noisy: torch.Tensor, pred: torch.Tensor,
                        timesteps: torch.Tensor) -> torch.Tensor:
        """The clean latents a prediction implies: x_t - s * v (velocity models)."""
        s = (timesteps.float() / 1000.0).view(-1, *([1] * (noisy.ndim - 1)))
        return noisy.float() - s * pred.float()

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        if self.settings.timestep_type == "weighted":
            return bell_weights(timesteps)
        return None

    def timesteps_at(self, sigmas: torch.Tensor) -> torch.Tensor:
        return sigmas.float() * 1000.0

    def denoise_step(self, noisy: torch.Tensor, pred: torch.Tensor, timesteps: torch.Tensor,
                     next_timesteps: torch.Tensor) -> torch.Tensor:
        """Euler along the velocity: x_next = x + (s_next - s) * v, s = t / 1000."""
        return euler_step(noisy, pred, timesteps, next_timesteps)
