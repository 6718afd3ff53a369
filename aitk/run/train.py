"""The training loop, in nanoGPT's order: LR, sample, checkpoint, micro-steps, clip,
step, log, stop. Everything else is a named call; model differences live behind the
BaseModel hooks, never in here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from aitk.data.batch import DataBatch
from aitk.diffusion.noise import check_finite
from aitk.models.base import BaseModel
from aitk.run import distributed
from aitk.run.objectives import PLAIN, Objective
from aitk.run.optim import Schedule, lr_at, set_lr
from aitk_common.requests import Request


@runtime_checkable
class StepObjective(Protocol):
    """A loss that backpropagates its own passes: the sliders (aitk.run.slider), one
    backward per adapter polarity, because gradient checkpointing recomputes a forward
    pass during backward and must see the multiplier that pass ran with."""

    def backward_step(self, model: BaseModel, batch: DataBatch, generator: torch.Generator,
                      accumulation: int) -> torch.Tensor:
        """Backpropagate the micro-batch's loss divided by `accumulation`; return the
        loss, detached."""
        ...


LossFn = Objective | StepObjective  # what a micro-step minimises


class Outcome(Enum):
    FINISHED = "finished"
    STOPPED = "stopped"  # Ctrl+C/SIGTERM: saved at a step boundary


@dataclass(frozen=True)
class LoopSettings:
    total_steps: int
    accumulation: int = 1
    max_grad_norm: float = 1.0
    save_every: int = 250
    sample_every: int | None = None  # None: no previews
    sample_first: bool = True
    sample_start: int = 0  # no cadence previews before this step (sample_start_step)
    validate_every: int | None = None  # None: no validation loss
    seed: int = 42
    # Losses are read (a device sync) and logged every `log_every` steps, before that
    # step's update, and always before a sample, a save or the end: a NaN loss stops
    # the run before it reaches a checkpoint (with 1, before it reaches the weights).
    log_every: int = 1
    # Data-parallel ranks (aitk.run.distributed): noise micro-steps are numbered as if one
    # process ran them all, and gradients and the logged loss are means over ranks.
    world: distributed.World = distributed.World()


@dataclass
class Run:
    """What the loop needs; aitk.run.process builds it, tests build it from stand-ins."""

    model: BaseModel
    params: Sequence[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    settings: LoopSettings
    next_batch: Callable[[], DataBatch]
    save: Callable[[int], None]  # checkpoint + LoRA file for a step
    sample: Callable[[int], None]
    log: Callable[[int, float, float], None]
    stop_requested: Callable[[], bool] = lambda: False
    # "save now" / "sample now" from outside (aitk_common.requests), at a step boundary.
    requested: Callable[[], frozenset[Request]] = lambda: frozenset()
    objective: LossFn = PLAIN  # what a micro-step minimises (aitk.run.objectives)
    after_update: Callable[[], None] = lambda: None  # the adapter's EMA, when on
    validate: Callable[[int], None] = lambda step: None  # held-out loss at a step


def step_generator(seed: int, step: int, micro: int) -> torch.Generator:
    """Noise and timesteps of one micro-step depend on (seed, step, micro) alone, so a
    resumed run draws exactly what an uninterrupted one would."""
    state = np.random.SeedSequence([seed, step, micro]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def compute_loss(model: BaseModel, batch: DataBatch, generator: torch.Generator,
                 objective: Objective = PLAIN) -> torch.Tensor:
    """One batch through the model's noise schedule (aitk.diffusion.noise) and the
    objective's terms (aitk.run.objectives): noise and timesteps drawn, mixed,
    conditioned, predicted and scored."""
    return objective(model, batch, generator)


def micro_step(objective: LossFn, model: BaseModel, batch: DataBatch,
               generator: torch.Generator, accumulation: int) -> torch.Tensor:
    """One micro-batch's loss, backpropagated; returns it detached."""
    if isinstance(objective, StepObjective):
        return objective.backward_step(model, batch, generator, accumulation)
    loss = compute_loss(model, batch, generator, objective)
    # Divide so accumulated gradients are the mean over micro-batches.
    (loss / accumulation).backward()
    return loss.detach()


def flush_losses(pending: list[tuple[int, torch.Tensor, float]],
                 log: Callable[[int, float, float], None]) -> None:
    """Read the pending step losses in one device sync, stop on a non-finite one, log."""
    if not pending:
        return
    values = torch.stack([loss for _, loss, _ in pending]).tolist()
    for (step, _, lr), value in zip(pending, values, strict=True):
        log(step, check_finite(value, step), lr)
    pending.clear()


def due(every: int | None, step: int, start_step: int, s: LoopSettings,
        first: bool = True, from_step: int = 0) -> bool:
    """A preview or a validation at `step`: every `every` steps from `from_step` on, the
    last step, and step 0 when `first`."""
    if every is None or (step == start_step and step > 0):
        return False  # a resumed run already did (or skipped) this step
    if step == 0:
        return first
    return (step % every == 0 and step >= from_step) or step == s.total_steps


def should_sample(step: int, start_step: int, s: LoopSettings) -> bool:
    return due(s.sample_every, step, start_step, s, s.sample_first, s.sample_start)


def train(run: Run, start_step: int) -> Outcome:
    s = run.settings
    step = last_saved = start_step
    pending: list[tuple[int, torch.Tensor, float]] = []  # losses not yet read
    while True:
        lr = lr_at(step, run.schedule)  # depends on the step alone: nothing to resume
        stopping = run.stop_requested()
        asked = run.requested()
        sampling = (should_sample(step, start_step, s) or Request.SAMPLE in asked) \
            and not stopping
        # Also when stopping: the resumed run starts past this step's validation.
        validating = due(s.validate_every, step, start_step, s)
        saving = step > last_saved and (step % s.save_every == 0 or step == s.total_steps
                                        or stopping or Request.SAVE in asked)
        done = stopping or step >= s.total_steps
        if sampling or validating or saving or done:
            flush_losses(pending, run.log)
        if validating:
            run.validate(step)
        if sampling:
            run.sample(step)
        if saving:
            run.save(step)
            last_saved = step
        if done:
            return Outcome.STOPPED if stopping else Outcome.FINISHED

        set_lr(run.optimizer, lr)
        run.optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=run.model.device)
        for micro in range(s.accumulation):
            # A pure function of the step: multi-expert models pick their expert here.
            run.model.begin_micro_step(step * s.accumulation + micro)
            batch = run.next_batch()
            micro_id = distributed.micro_index(s.world, micro)
            loss = micro_step(run.objective, run.model, batch,
                              step_generator(s.seed, step, micro_id), s.accumulation)
            step_loss += loss / s.accumulation
        distributed.average_gradients(s.world, run.params)
        pending.append((step + 1, distributed.mean(s.world, step_loss), lr))
        if len(pending) >= s.log_every:  # before the update: a NaN stops it
            flush_losses(pending, run.log)
        if s.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(run.params, s.max_grad_norm)
        run.optimizer.step()
        run.after_update()
        step += 1
