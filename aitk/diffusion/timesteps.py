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
- `shift`, `flux_shift`, `lumina2_shift`: s ~ U(0, 1), then shifted the way the model's own sampler
  shifts its schedule (`FlowShift`): resolution-dependent for models with dynamic
  shifting (Flux, Qwen-Image), by the model's fixed `shift` otherwise. Training then
  spends its steps on the noise levels the sampler will visit.
- `lognorm_blend`: upstream's mixture: with probability 3/4, s = 1 - X / M with X
  log-normal (sigma 1/3) and M = e^(3 sigma) (upstream divides by the largest of its
  draws, which sits about three sigmas out), else s ~ U(0, 1). It leans to s near 0.6.
- `next_sample`: s is one of the first `next_sample_timesteps - 2` levels of a short
  shifted sampling schedule (`next_sample_table`); the trainer then steps the noisy
  latents to the following level with the model's own prediction and trains there
  (aitk.run.objectives.NextSample), as upstream does.

`train.content_or_style` biases which quantile of the chosen distribution an item gets
(upstream's cubic bias, from diffusers' T2I-Adapter script): `content` takes 1 - u^3
(the noisy end, where layout and structure form), `style` u^3 (the clean end, where
texture and detail form), `balanced` u itself.

`train.min_denoising_steps` / `max_denoising_steps` (upstream's, 0 and 999 by default)
keep a window of the 1000-step training schedule, counted as upstream indexes it: from
pure noise (index 0) towards the clean image (index 999). Upstream indexes a sorted
table of 1000 draws of the distribution, so the window is a range of its quantiles:
index i is quantile 1 - i / 1000 (`step_window`), and the items' quantiles are squeezed
into it before the distribution's inverse CDF (and shift) turns them into noise levels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from aitk.config.choices import TIMESTEP_BIASES, TIMESTEP_TYPES

SHIFTED_TYPES = ("shift", "flux_shift", "lumina2_shift")  # upstream: three names, one rule
# lognorm_blend: the log-normal's sigma, its share of the mixture, and the divisor M.
BLEND_SIGMA, BLEND_SHARE = 1.0 / 3.0, 0.75
BLEND_MAX = math.exp(3.0 * BLEND_SIGMA)
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


def biased_quantiles(u: torch.Tensor, bias: str = "balanced") -> torch.Tensor:
    """`content_or_style`: uniform draws u -> the quantiles items get (see above)."""
    if bias == "content":
        return 1.0 - u ** 3
    if bias == "style":
        return u ** 3
    if bias == "balanced":
        return u
    raise ValueError(f"unknown content_or_style {bias!r}; use one of "
                     f"{', '.join(TIMESTEP_BIASES)}")


def _normal_quantile(q: torch.Tensor) -> torch.Tensor:
    return math.sqrt(2.0) * torch.erfinv(2.0 * q.clamp(1e-7, 1 - 1e-7) - 1.0)


def blend_cdf(s: torch.Tensor) -> torch.Tensor:
    """P(S <= s) for `lognorm_blend`: the log-normal part clamped at 0, plus U(0, 1)."""
    x = (BLEND_MAX * (1.0 - s)).clamp_min(1e-12)
    normal = torch.distributions.Normal(0.0, 1.0)
    lognormal_part = 1.0 - normal.cdf(torch.log(x) / BLEND_SIGMA)
    return BLEND_SHARE * lognormal_part + (1.0 - BLEND_SHARE) * s


DENOISING_STEPS = 1000  # the schedule min/max_denoising_steps index (upstream's)
FULL_STEPS = (0, DENOISING_STEPS - 1)


def step_window(steps: tuple[int, int], length: int = DENOISING_STEPS
                ) -> tuple[float, float]:
    """min/max_denoising_steps (indices from the noisy end of a `length`-step schedule)
    as the range [lo, hi) of quantiles of the noise level they keep."""
    first, last = steps
    return 1.0 - (last + 1) / length, 1.0 - first / length


def in_window(q: torch.Tensor, window: tuple[float, float]) -> torch.Tensor:
    """Quantiles in [0, 1) squeezed into the window (the full window: unchanged)."""
    lo, hi = window
    return lo + (hi - lo) * q


def blend_quantile(q: torch.Tensor, iterations: int = 40) -> torch.Tensor:
    """The inverse of `blend_cdf` by bisection (monotone, no closed form): 40 halvings
    of (0, 1) are below float32's resolution."""
    lo, hi = torch.zeros_like(q), torch.ones_like(q)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        below = blend_cdf(mid) < q
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return (lo + hi) / 2


def sample_sigmas(batch_size: int, generator: torch.Generator, kind: str = "sigmoid",
                  bias: str = "balanced", steps: tuple[int, int] = FULL_STEPS
                  ) -> torch.Tensor:
    """(B,) float32 noise levels in (0, 1), before any shift; `steps`: the window of
    min/max_denoising_steps (the full one draws as before it existed)."""
    window = step_window(steps)
    if kind not in TIMESTEP_TYPES or kind == "next_sample":
        raise ValueError(f"unknown timestep_type {kind!r}; use one of "
                         f"{', '.join(t for t in TIMESTEP_TYPES if t != 'next_sample')}")
    if kind == "lognorm_blend":
        s = blend_quantile(in_window(biased_quantiles(
            torch.rand(batch_size, generator=generator), bias), window))
    elif bias != "balanced" or steps != FULL_STEPS:
        # one uniform per item through the distribution's quantile
        q = in_window(biased_quantiles(torch.rand(batch_size, generator=generator), bias),
                      window)
        s = torch.sigmoid(_normal_quantile(q)) if kind in ("sigmoid", "logit_normal") else q
    elif kind in ("sigmoid", "logit_normal"):
        s = torch.sigmoid(torch.randn(batch_size, generator=generator))
    else:
        s = torch.rand(batch_size, generator=generator)
    return s.clamp(S_MIN, S_MAX)


def sample_timesteps(batch_size: int, generator: torch.Generator, kind: str = "sigmoid",
                     shift: FlowShift | None = None, image_seq_len: int = 0,
                     bias: str = "balanced", steps: tuple[int, int] = FULL_STEPS
                     ) -> torch.Tensor:
    """(B,) float32 timesteps in (0, 1000); `shift` applies to the shifted kinds only
    (it keeps the order, so the step window is the same quantiles shifted)."""
    s = sample_sigmas(batch_size, generator, kind, bias, steps)
    if kind in SHIFTED_TYPES and shift is not None:
        s = shift.apply(s, image_seq_len).clamp(S_MIN, S_MAX)
    return s * 1000.0


def next_sample_table(steps: int, shift: FlowShift | None, image_seq_len: int
                      ) -> torch.Tensor:
    """`next_sample`'s schedule: `steps` noise levels from 1 down to 1/1000, evenly
    spaced then shifted like the model's sampler (upstream's `shift` training table)."""
    s = torch.linspace(1.0, 1.0 / 1000.0, steps)
    if shift is not None:
        s = shift.apply(s, image_seq_len)
    return s.clamp(S_MIN, S_MAX)


def sample_from_table(batch_size: int, generator: torch.Generator, table: torch.Tensor
                      ) -> torch.Tensor:
    """`next_sample`: (B,) timesteps on 0..1000, each one of the table's levels but the
    last two (upstream's index range), so a following level always exists."""
    index = torch.randint(0, max(1, len(table) - 2), (batch_size,), generator=generator)
    return table[index] * 1000.0


def following_level(timesteps: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The table level after each timestep's (timesteps drawn by `sample_from_table`)."""
    index = (table[None, :] * 1000.0 - timesteps.float().cpu()[:, None]).abs().argmin(1)
    return (table[(index + 1).clamp(max=len(table) - 1)] * 1000.0).to(timesteps.device)


def bell_weights(timesteps: torch.Tensor) -> torch.Tensor:
    """`weighted`: exp(-2 (s - 0.5)^2) rescaled so its mean over U(0, 1) is 1."""
    s = timesteps.float() / 1000.0
    # The integral of exp(-2 (s - 0.5)^2) over [0, 1] is sqrt(pi / 2) * erf(1 / sqrt(2)).
    mean = math.sqrt(math.pi / 2.0) * math.erf(1.0 / math.sqrt(2.0))
    return torch.exp(-2.0 * (s - 0.5) ** 2) / mean
