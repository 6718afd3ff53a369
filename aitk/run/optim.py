"""Optimizer construction and the learning-rate schedule.

`lr_at(step)` depends on the step alone (nanoGPT's habit), so resuming needs no
scheduler state: the LR at step k is the same whether or not the run was interrupted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aitk.errors import OptimizerUnavailable

SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    lr: float
    total_steps: int
    kind: str = "constant"
    warmup_steps: int = 0
    eta_min: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown lr_scheduler {self.kind!r}; use one of {SCHEDULES}")


def lr_at(step: int, sched: Schedule) -> float:
    """LR for optimizer step `step` (0-based): linear warmup, then the decay."""
    if step < sched.warmup_steps:
        return sched.lr * (step + 1) / sched.warmup_steps
    if sched.kind in ("constant", "constant_with_warmup"):
        return sched.lr
    span = max(1, sched.total_steps - sched.warmup_steps)
    progress = min(1.0, (step - sched.warmup_steps) / span)
    if sched.kind == "linear":
        factor = 1.0 - progress
    else:  # cosine
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return sched.eta_min + (sched.lr - sched.eta_min) * factor


ParamGroup = dict[str, Any]  # torch's param group; `lr_scale`: its rate over the base LR


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter] | Sequence[ParamGroup],
                    lr: float, weight_decay: float, betas: tuple[float, float],
                    eps: float) -> torch.optim.Optimizer:
    """`params`: the parameters, or groups of them (dicts with `params` and an optional
    `lr_scale`, which set_lr applies at every step)."""
    given = list(params)
    raw = given if given and isinstance(given[0], dict) else [{"params": given}]
    groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in raw]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("nothing to train: the adapter has no trainable parameters")
    for group in groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, betas=betas,
                                 eps=eps)
    if name == "adamw8bit":
        try:
            import bitsandbytes as bnb  # optional: CUDA boxes only
        except ImportError:
            raise OptimizerUnavailable(
                "optimizer adamw8bit needs bitsandbytes, which is not installed here; "
                "use `optimizer: adamw` or install bitsandbytes") from None
        return bnb.optim.AdamW8bit(groups, lr=lr, weight_decay=weight_decay, betas=betas,
                                   eps=eps)
    raise ValueError(f"unknown optimizer {name!r}; use adamw or adamw8bit")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The step's rate on every group, times the group's `lr_scale` (the text encoders'
    `text_encoder_lr / lr`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
