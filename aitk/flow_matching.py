"""Flow matching, the way the math reads (diffusers' dreambooth flux script has the same
shape): s from a sampled u, input (1 - s) x0 + s noise, target noise - x0.

Timesteps cross the model API on 0..1000 where 1000 is pure noise (s = t / 1000).
Randomness comes only from the generator passed in, so a step's draws depend on the
seed and the step, never on what ran before (exact resume needs that).
"""

from __future__ import annotations

import math

import torch

TIMESTEP_TYPES = ("sigmoid", "logit_normal", "linear", "uniform")


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf: training stops instead of hiding it."""

    exit_code = 1

    def __init__(self, step: int, value: float) -> None:
        self.step = step
        super().__init__(f"loss is {value} at step {step}; stopping. Lower the learning "
                         "rate, use fp32, or check the dataset; the last checkpoint is kept")


def sample_timesteps(batch_size: int, generator: torch.Generator,
                     kind: str = "sigmoid") -> torch.Tensor:
    """(B,) float32 timesteps in (0, 1000).

    sigmoid / logit_normal: s = sigmoid(n), n ~ N(0, 1) -- favours the middle, where
    flow-matching models learn most (SD3 paper). linear / uniform: s ~ U(0, 1).
    """
    if kind in ("sigmoid", "logit_normal"):
        s = torch.sigmoid(torch.randn(batch_size, generator=generator))
    elif kind in ("linear", "uniform"):
        s = torch.rand(batch_size, generator=generator)
    else:
        raise ValueError(f"unknown timestep_type {kind!r}; use one of {TIMESTEP_TYPES}")
    # Keep s strictly inside (0, 1): s = 0 would make the input the clean image.
    return s.clamp(1e-5, 1.0 - 1e-5) * 1000.0


def flow_matching_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error in float32, whatever dtype the model ran in."""
    return torch.nn.functional.mse_loss(pred.float(), target.float())


def check_finite(loss: torch.Tensor, step: int) -> float:
    value = float(loss.detach())
    if not math.isfinite(value):
        raise NonFiniteLoss(step, value)
    return value
