"""Training timesteps: which noise levels a step trains on, and how they are shifted.

Everything here is a pure function of its inputs and the generator passed in, so a
resumed run draws exactly what an uninterrupted one would. Noise levels are sigmas in
(0, 1) (flow matching: x_t = (1 - s) x0 + s noise); the model API gets them as
timesteps t = 1000 s, where 1000 is pure noise.

`train.timestep_type` (upstream's values):

- `sigmoid`, `logit_normal`: s = sigmoid(n), n ~ N(0, 1): favours the middle, where
  flow-matching models learn most (SD3 paper). The two names are one distribution.
- `linear`, `uniform`: s ~ U(0, 1).
- `weighted`: s ~ U(0, 1), and each item's loss is weighted by a bell curve over s
  (peak at 0.5, mean weight 1), the same emphasis as `sigmoid` without skipping the
  ends of the range.
- `shift`, `flux_shift`: s ~ U(0, 1), then shifted the way the model's own sampler
  shifts its schedule (`FlowShift`): resolution-dependent for models with dynamic
  shifting (Flux, Qwen-Image), by the model's fixed `shift` otherwise. Training then
  spends its steps on the noise levels the sampler will visit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from aitk.config.choices import TIMESTEP_TYPES

SHIFTED_TYPES = ("shift", "flux_shift")
# s stays strictly inside (0, 1): s = 0 would make the input the clean image.
S_MIN, S_MAX = 1e-5, 1.0 - 1e-5


@dataclass(frozen=True)
class FlowShift:
    """How a flow-matching model shifts noise levels toward the noisy end.

    Fixed: s' = shift * s / (1 + (shift - 1) * s) (SD3, `shift: 3.0`).
    Dynamic: mu grows linearly with the number of image tokens, from `base_shift` at
    `base_seq_len` to `max_shift` at `max_seq_len`; then s' = e^mu / (e^mu + 1/s - 1)
    (exponential, Flux and Qwen-Image) or mu / (mu + 1/s - 1) (linear). Larger images
    keep more structure at a given s, so they need more noise to train the same thing.
    """

    shift: float = 1.0
    dynamic: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_seq_len: int = 256
    max_seq_len: int = 4096
    exponential: bool = True

    @classmethod
    def from_scheduler_config(cls, config: Any) -> FlowShift:
        """Read a diffusers FlowMatchEulerDiscreteScheduler config (dict-like)."""
        get = config.get if hasattr(config, "get") else lambda k, d=None: getattr(config, k, d)
        return cls(shift=float(get("shift", 1.0) or 1.0),
                   dynamic=bool(get("use_dynamic_shifting", False)),
                   base_shift=float(get("base_shift", 0.5) or 0.5),
                   max_shift=float(get("max_shift", 1.15) or 1.15),
                   base_seq_len=int(get("base_image_seq_len", 256) or 256),
                   max_seq_len=int(get("max_image_seq_len", 4096) or 4096),
                   exponential=get("time_shift_type", "exponential") != "linear")

    def mu(self, image_seq_len: int) -> float:
        slope = (self.max_shift - self.base_shift) / (self.max_seq_len - self.base_seq_len)
        return self.base_shift + slope * (image_seq_len - self.base_seq_len)

    def apply(self, s: torch.Tensor, image_seq_len: int) -> torch.Tensor:
        if self.dynamic:
            mu = self.mu(image_seq_len)
            m = math.exp(mu) if self.exponential else mu
            return m / (m + (1.0 / s - 1.0))
        if self.shift == 1.0:
            return s
        return self.shift * s / (1.0 + (self.shift - 1.0) * s)


def sample_sigmas(batch_size: int, generator: torch.Generator, kind: str = "sigmoid"
                  ) -> torch.Tensor:
    """(B,) float32 noise levels in (0, 1), before any shift."""
    if kind in ("sigmoid", "logit_normal"):
        s = torch.sigmoid(torch.randn(batch_size, generator=generator))
    elif kind in ("linear", "uniform", "weighted", *SHIFTED_TYPES):
        s = torch.rand(batch_size, generator=generator)
    else:
        raise ValueError(f"unknown timestep_type {kind!r}; use one of "
                         f"{', '.join(TIMESTEP_TYPES)}")
    return s.clamp(S_MIN, S_MAX)


def sample_timesteps(batch_size: int, generator: torch.Generator, kind: str = "sigmoid",
                     shift: FlowShift | None = None, image_seq_len: int = 0) -> torch.Tensor:
    """(B,) float32 timesteps in (0, 1000); `shift` applies to the shifted kinds only."""
    s = sample_sigmas(batch_size, generator, kind)
    if kind in SHIFTED_TYPES and shift is not None:
        s = shift.apply(s, image_seq_len).clamp(S_MIN, S_MAX)
    return s * 1000.0


def bell_weights(timesteps: torch.Tensor) -> torch.Tensor:
    """`weighted`: exp(-2 (s - 0.5)^2) rescaled so its mean over U(0, 1) is 1."""
    s = timesteps.float() / 1000.0
    # The integral of exp(-2 (s - 0.5)^2) over [0, 1] is sqrt(pi / 2) * erf(1 / sqrt(2)).
    mean = math.sqrt(math.pi / 2.0) * math.erf(1.0 / math.sqrt(2.0))
    return torch.exp(-2.0 * (s - 0.5) ** 2) / mean
