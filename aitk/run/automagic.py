"""Automagic: upstream AI Toolkit's own optimizer (`optimizer: automagic`), written here
from what it documents and does, so its configs train as they do there.

Why it exists: LoRA users rarely know a good learning rate, and one rate for every
weight is a compromise. Automagic keeps a learning rate *per weight* and tunes it
from the training signal itself, with Adafactor's memory-light second moments:

1. Second moment, Adafactor-style with a fixed decay `beta2` (no bias correction):
   for a matrix, running means of (g^2 + eps) over its rows and its columns, whose
   outer product (normalised by the row mean) approximates the full one; a vector keeps
   the full running mean. The update is g / sqrt(second moment).
2. The update is scaled down so its root-mean-square is at most `clip_threshold`.
3. Sign agreement: where the update has the same sign as the previous step's, that
   weight's rate grows by `lr_bump`; where the sign flips (the weight overshot), it
   shrinks by `lr_bump`; each rate stays within [min_lr, max_lr]. Rates start at `lr`.
   As upstream, the "previous sign" before the first step counts as negative.
4. Weight decay (decoupled, at each weight's own rate), then weight -= rate * update.

`lr` above 1e-3 is taken as a plain Adam rate and the rates start at 1e-6 instead
(aitk.config.optimizers.effective_lr, as upstream). The group's `lr`, which the LR
schedule sets every step, is not used: the rates are the schedule.

Differences from upstream, on purpose: the per-weight rates are kept in float32
(upstream stores them in 8 bits; for adapter weights the memory saved is small, and
8-bit rounding blurs changes the size of `lr_bump`); upstream's parameter swapping and
stochastic rounding for low-precision weights are not here (aitk trains adapter weights
in float32). The whole state is in `state_dict()`, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Automagic(torch.optim.Optimizer):
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-6,
                 min_lr: float = 1e-7, max_lr: float = 1e-3, lr_bump: float = 1e-6,
                 eps: tuple[float, float] = (1e-30, 1e-3), clip_threshold: float = 1.0,
                 beta2: float = 0.999, weight_decay: float = 0.0) -> None:
        if not 0.0 < min_lr <= max_lr:
            raise ValueError(f"automagic needs 0 < min_lr <= max_lr (got {min_lr}, {max_lr})")
        defaults = {"lr": lr, "start_lr": lr, "min_lr": min_lr, "max_lr": max_lr,
                    "lr_bump": lr_bump, "eps": eps, "clip_threshold": clip_threshold,
                    "beta2": beta2, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @staticmethod
    def _rms(t: torch.Tensor) -> torch.Tensor:
        return t.norm(2) / (t.numel() ** 0.5)

    def _init_state(self, p: torch.nn.Parameter, group: dict[str, Any]) -> dict[str, Any]:
        state = self.state[p]
        state["step"] = 0
        state["lr_mask"] = torch.full_like(p, group["start_lr"], dtype=torch.float32)
        state["last_positive"] = torch.zeros_like(p, dtype=torch.bool)
        if p.dim() >= 2:
            state["row"] = torch.zeros(p.shape[:-1], dtype=torch.float32, device=p.device)
            state["col"] = torch.zeros(p.shape[:-2] + p.shape[-1:], dtype=torch.float32,
                                       device=p.device)
        else:
            state["second"] = torch.zeros_like(p, dtype=torch.float32)
        return state

    def _direction(self, grad: torch.Tensor, state: dict[str, Any],
                   group: dict[str, Any]) -> torch.Tensor:
        """Steps 1 and 2: g / sqrt(second moment), clipped in RMS."""
        beta2, eps = group["beta2"], group["eps"]
        squared = grad * grad + (eps[0] if isinstance(eps, tuple | list) else eps)
        if "row" in state:
            row, col = state["row"], state["col"]
            row.mul_(beta2).add_(squared.mean(dim=-1), alpha=1.0 - beta2)
            col.mul_(beta2).add_(squared.mean(dim=-2), alpha=1.0 - beta2)
            r = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
            update = r * col.unsqueeze(-2).rsqrt() * grad
        else:
            second = state["second"]
            second.mul_(beta2).add_(squared, alpha=1.0 - beta2)
            update = second.rsqrt() * grad
        return update / (self._rms(update) / group["clip_threshold"]).clamp(min=1.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("automagic does not support sparse gradients")
                state = self.state[p] if self.state[p] else self._init_state(p, group)
                state["step"] += 1
                update = self._direction(p.grad.float(), state, group)
                positive = update > 0
                # .bool(): torch's load_state_dict casts state to the weights' dtype
                agree = positive == state["last_positive"].bool()
                state["last_positive"] = positive
                bump = torch.where(agree, group["lr_bump"], -group["lr_bump"])
                rates = (state["lr_mask"] + bump).clamp_(group["min_lr"], group["max_lr"])
                state["lr_mask"] = rates
                weight = p.float()
                if group["weight_decay"]:
                    weight = weight - weight * group["weight_decay"] * rates
                p.copy_(weight - rates * update)
        return loss

    def mean_lr(self) -> float:
        """The mean per-weight rate (what upstream logs as this optimizer's LR)."""
        masks = [s["lr_mask"] for s in self.state.values() if "lr_mask" in s]
        if not masks:
            return float(self.param_groups[0]["start_lr"])
        return float(torch.cat([m.flatten() for m in masks]).mean())
