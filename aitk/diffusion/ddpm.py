"""DDPM noise for epsilon- and v-prediction UNets (SDXL), on diffusers' DDPMScheduler.

x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise, with t an integer in 0..999 (999 is
almost pure noise, so the API's "1000 is noise" direction holds). Targets: epsilon ->
the noise; v_prediction -> v = sqrt(abar_t) noise - sqrt(1 - abar_t) x0
(scheduler.get_velocity). `min_snr_gamma` weights each item by min(SNR, gamma) / SNR
(epsilon) or min(SNR, gamma) / (SNR + 1) (v), the Min-SNR rule (Hang et al. 2023), so
the easy low-noise steps stop dominating the gradient. `snr_gamma` (upstream's, which
wins over min_snr_gamma there too) weights by gamma / SNR itself, unclipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from aitk.diffusion.noise import NoiseSettings, sample_noise
from aitk.diffusion.timesteps import FULL_STEPS, biased_quantiles, in_window, step_window

PREDICTION_TYPES = ("epsilon", "v_prediction")


@dataclass(frozen=True)
class DDPMSchedule:
    scheduler: Any  # diffusers.DDPMScheduler
    settings: NoiseSettings = NoiseSettings()

    @classmethod
    def from_config(cls, config: Any, settings: NoiseSettings,
                    prediction_type: str | None = None) -> DDPMSchedule:
        """A training DDPMScheduler from any diffusers scheduler config (SDXL ships an
        Euler one: the betas are what matter for training)."""
        from diffusers import DDPMScheduler

        overrides = {"prediction_type": prediction_type} if prediction_type else {}
        return cls(DDPMScheduler.from_config(dict(config), **overrides), settings)

    @property
    def prediction_type(self) -> str:
        return self.scheduler.config.prediction_type

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler.config.num_train_timesteps)

    def sample_noise(self, clean: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return sample_noise(clean, generator, self.settings.noise_offset)

    def sample_timesteps(self, clean: torch.Tensor, generator: torch.Generator
                         ) -> torch.Tensor:
        """Integer steps, uniform over 0..num_train_timesteps-1 (as float32);
        `content_or_style` leans them to the noisy or the clean end, and
        min/max_denoising_steps keep steps n-1-max .. n-1-min (upstream indexes the
        schedule from its noisy end; timesteps.py)."""
        n = self.num_train_timesteps
        bias, steps = self.settings.content_or_style, self.settings.denoising_steps
        if bias == "balanced" and steps == FULL_STEPS:
            t = torch.randint(0, n, (clean.shape[0],), generator=generator)
        else:
            first, last = steps[0], min(steps[1], n - 1)  # upstream clips to the schedule
            q = in_window(biased_quantiles(torch.rand(clean.shape[0], generator=generator),
                                           bias), step_window((first, last), n))
            t = (q * n).long().clamp(n - 1 - last, n - 1 - first)
        return t.to(clean.device, torch.float32)

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor,
                  timesteps: torch.Tensor) -> torch.Tensor:
        noisy = self.scheduler.add_noise(clean.float(), noise.float(), timesteps.long())
        return noisy.to(clean.dtype)

    def target(self, clean: torch.Tensor, noise: torch.Tensor,
               timesteps: torch.Tensor) -> torch.Tensor:
        if self.prediction_type == "epsilon":
            return noise
        if self.prediction_type == "v_prediction":
            v = self.scheduler.get_velocity(clean.float(), noise.float(), timesteps.long())
            return v.to(clean.dtype)
        raise ValueError(f"prediction_type {self.prediction_type!r} is not trainable; use "
                         f"one of {', '.join(PREDICTION_TYPES)}")

    def snr(self, timesteps: torch.Tensor) -> torch.Tensor:
        from diffusers.training_utils import compute_snr

        return compute_snr(self.scheduler, timesteps.long().cpu()).float()

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        """Per-item weights from the SNR: `snr_gamma` (upstream's, checked first as
        upstream does) gamma / SNR unclipped, for either target; else `min_snr_gamma`'s
        Min-SNR rule; None with neither."""
        fixed, gamma = self.settings.snr_gamma, self.settings.min_snr_gamma
        if not (fixed or gamma):
            return None
        snr = self.snr(timesteps)
        if fixed:
            return (float(fixed) / snr).to(timesteps.device)
        clipped = torch.clamp(snr, max=float(gamma))
        weights = clipped / (snr + 1.0) if self.prediction_type == "v_prediction" \
            else clipped / snr
        return weights.to(timesteps.device)

    def timesteps_at(self, sigmas: torch.Tensor) -> torch.Tensor:
        """A noise level s -> step round(s * N), at most N - 1 (as upstream validates)."""
        n = self.num_train_timesteps
        return (sigmas.float() * n).round().clamp(0, n - 1)

    def denoise_step(self, noisy: torch.Tensor, pred: torch.Tensor, timesteps: torch.Tensor,
                     next_timesteps: torch.Tensor) -> torch.Tensor:
        """DDIM (eta 0): the clean latents and the noise read from the prediction, then
        noised again to `next_timesteps` (integer steps, 999 at most)."""
        shape = (-1, *([1] * (noisy.ndim - 1)))
        abar = self.scheduler.alphas_cumprod.float()
        last = self.num_train_timesteps - 1

        def at(t: torch.Tensor) -> torch.Tensor:
            return abar[t.long().clamp(0, last).cpu()].view(shape).to(noisy.device)

        a, a_next = at(timesteps), at(next_timesteps)
        x, p = noisy.float(), pred.float()
        if self.prediction_type == "v_prediction":
            clean = a.sqrt() * x - (1 - a).sqrt() * p
            noise = (1 - a).sqrt() * x + a.sqrt() * p
        else:
            noise = p
            clean = (x - (1 - a).sqrt() * p) / a.sqrt()
        return (a_next.sqrt() * clean + (1 - a_next).sqrt() * noise).to(noisy.dtype)
