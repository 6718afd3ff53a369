"""Optimizer construction and the learning-rate schedule.

`lr_at(step)` depends on the step alone (nanoGPT's habit), so resuming needs no
scheduler state: the LR at step k is the same whether or not the run was interrupted.
Each schedule is torch's scheduler of the same name (upstream's `toolkit/scheduler.py`)
written as a function of the step, after an optional linear warmup:

    constant, constant_with_warmup   lr
    linear                            lr -> eta_min over the run
    cosine                            half a cosine from lr to eta_min over the run
    cosine_with_restarts              cosine cycles of T_0 steps (each next one T_mult
                                      times longer), back to lr at each restart
                                      (CosineAnnealingWarmRestarts)
    step                              lr * gamma ** (k // step_size)  (StepLR)

The optimizers (aitk.config.optimizers says which, with their settings) are built here;
each one's whole state is in its `state_dict()`, which the checkpoint holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aitk.config import optimizers
from aitk.config.choices import LR_SCHEDULERS
from aitk.errors import OptimizerUnavailable

SCHEDULES = LR_SCHEDULERS


@dataclass(frozen=True)
class Schedule:
    lr: float
    total_steps: int
    kind: str = "constant"
    warmup_steps: int = 0
    eta_min: float = 0.0
    cycle_steps: int | None = None  # cosine_with_restarts: T_0 (None: the whole run)
    cycle_mult: int = 1  # cosine_with_restarts: T_mult
    step_size: int | None = None  # step
    gamma: float = 0.1  # step

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown lr_scheduler {self.kind!r}; use one of {SCHEDULES}")
        if self.kind == "step" and not self.step_size:
            raise ValueError("lr_scheduler step needs a step_size")


def _cosine(sched: Schedule, progress: float) -> float:
    return sched.eta_min + (sched.lr - sched.eta_min) * 0.5 * (1.0 + math.cos(math.pi *
                                                                             progress))


def _restart_progress(t: int, first: int, mult: int) -> float:
    """How far into its cosine cycle step `t` is (0 at each restart)."""
    if mult == 1:
        return (t % first) / first
    # Cycle i spans first * mult**i steps; find the cycle t falls in (torch's formula).
    cycle = int(math.log(t / first * (mult - 1) + 1, mult))
    start = first * (mult ** cycle - 1) // (mult - 1)
    if start > t:  # float rounding at a cycle boundary
        cycle -= 1
        start = first * (mult ** cycle - 1) // (mult - 1)
    return (t - start) / (first * mult ** cycle)


def lr_at(step: int, sched: Schedule) -> float:
    """LR for optimizer step `step` (0-based): linear warmup, then the decay."""
    if step < sched.warmup_steps:
        return sched.lr * (step + 1) / sched.warmup_steps
    if sched.kind in ("constant", "constant_with_warmup"):
        return sched.lr
    t = step - sched.warmup_steps
    span = max(1, sched.total_steps - sched.warmup_steps)
    if sched.kind == "step":
        assert sched.step_size
        return sched.lr * sched.gamma ** (t // sched.step_size)
    if sched.kind == "cosine_with_restarts":
        return _cosine(sched, _restart_progress(t, sched.cycle_steps or span,
                                                sched.cycle_mult))
    progress = min(1.0, t / span)
    if sched.kind == "linear":
        return sched.eta_min + (sched.lr - sched.eta_min) * (1.0 - progress)
    return _cosine(sched, progress)


def schedule_from_config(train: Any) -> Schedule:
    """The Schedule of a job's `train:` section (aitk.config.schema.TrainConfig), over
    the rate the optimizer takes (a multiplier for the learning-rate-free ones)."""
    p = train.lr_scheduler_params
    lr = optimizers.effective_lr(optimizers.OPTIMIZERS[train.optimizer], train.lr)
    return Schedule(lr, train.steps, train.lr_scheduler, p.warmup_steps, p.eta_min,
                    cycle_steps=p.T_0 or p.total_iters, cycle_mult=p.T_mult,
                    step_size=p.step_size, gamma=p.gamma)


def _import(package: optimizers.Package, spec: optimizers.OptimizerSpec) -> Any:
    import importlib

    try:
        if package is optimizers.BITSANDBYTES:
            return import_bitsandbytes()
        return importlib.import_module(package.module)
    except ImportError:
        raise OptimizerUnavailable(optimizers.unavailable_message(spec, [package])
                                   ) from None


def import_bitsandbytes() -> Any:
    """bitsandbytes (its import-time kernel warning is silenced in aitk/__init__.py)."""
    import bitsandbytes

    return bitsandbytes


def _constructor(spec: optimizers.OptimizerSpec) -> Any:
    name = spec.name
    if name == "adamw":
        return torch.optim.AdamW
    if name == "adam":
        return torch.optim.Adam
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor
    if name == "automagic":
        from aitk.run.automagic import Automagic

        return Automagic
    modules = [_import(p, spec) for p in spec.packages]
    if name in ("adamw8bit", "adam8bit", "lion8bit"):
        bnb = modules[0]
        return {"adamw8bit": bnb.optim.AdamW8bit, "adam8bit": bnb.optim.Adam8bit,
                "lion8bit": bnb.optim.Lion8bit}[name]
    if name == "lion":
        return modules[0].Lion
    if name == "prodigy":
        return modules[0].Prodigy
    if name == "prodigy8bit":
        from aitk.run.prodigy8bit import Prodigy8bit

        return Prodigy8bit
    if name == "dadaptation":
        return modules[0].DAdaptAdam
    if name == "dadaptationlion":
        return modules[0].DAdaptLion
    raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(optimizers.NAMES)}")


ParamGroup = dict[str, Any]  # torch's param group; `lr_scale`: its rate over the base LR


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter] | Sequence[ParamGroup],
                    lr: float, settings: Mapping[str, Any] | None = None
                    ) -> torch.optim.Optimizer:
    """`name`'s optimizer over the trainable `params`: `settings` (a job's validated
    `optimizer_params`) over aitk's defaults for it (aitk.config.optimizers). `params`:
    the parameters, or groups of them (dicts with `params` and an optional `lr_scale`,
    which set_lr applies at every step)."""
    spec = optimizers.OPTIMIZERS.get(optimizers.canonical(name))
    if spec is None:
        raise ValueError(f"unknown optimizer {name!r}; use one of "
                         f"{', '.join(optimizers.NAMES)}")
    given = list(params)
    raw = given if given and isinstance(given[0], dict) else [{"params": given}]
    groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in raw]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("nothing to train: the adapter has no trainable parameters")
    base = optimizers.effective_lr(spec, lr)
    for group in groups:
        group["lr"] = base * group.get("lr_scale", 1.0)
    kwargs = {**spec.defaults, **(settings or {})}
    for key in ("betas", "eps"):  # YAML lists; the optimizers want tuples
        if isinstance(kwargs.get(key), list):
            kwargs[key] = tuple(kwargs[key])
    return _constructor(spec)(groups, lr=base, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The step's rate on every group, times the group's `lr_scale` (the text encoders'
    `text_encoder_lr / lr`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
