"""The training loop, in nanoGPT's order: LR, sample, checkpoint, micro-steps, clip,
step, log, stop. Everything else is a named call; model differences live behind the
BaseModel hooks, never in here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch

from aitk.batch import DataBatch
from aitk.flow_matching import check_finite, flow_matching_loss, sample_timesteps
from aitk.models.base import BaseModel
from aitk.optim import Schedule, lr_at, set_lr


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
    seed: int = 42
    timestep_type: str = "sigmoid"


@dataclass
class Run:
    """What the loop needs; job.py builds it, tests build it from stand-ins."""

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


def step_generator(seed: int, step: int, micro: int) -> torch.Generator:
    """Noise and timesteps of one micro-step depend on (seed, step, micro) alone, so a
    resumed run draws exactly what an uninterrupted one would."""
    state = np.random.SeedSequence([seed, step, micro]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def compute_loss(model: BaseModel, batch: DataBatch, generator: torch.Generator,
                 timestep_type: str) -> torch.Tensor:
    """Flow matching on one batch: x_t = (1 - s) x0 + s noise, target noise - x0."""
    assert batch.latents is not None and batch.prompt_embeds is not None
    clean = batch.latents.to(model.device, model.dtype)
    # Drawn on the CPU generator, then moved: the same numbers on every device.
    noise = torch.randn(clean.shape, generator=generator).to(model.device, model.dtype)
    timesteps = sample_timesteps(clean.shape[0], generator, timestep_type).to(model.device)
    noisy = model.add_noise(clean, noise, timesteps)
    model_input = model.condition_noisy_latents(noisy, batch)
    embeds = batch.prompt_embeds.to(model.device, model.dtype)
    pred = model.get_noise_prediction(model_input, timesteps, embeds, batch=batch)
    target = model.get_loss_target(noise=noise, batch=batch, clean_latents=clean)
    return flow_matching_loss(pred, target)


def should_sample(step: int, start_step: int, s: LoopSettings) -> bool:
    if s.sample_every is None or (step == start_step and step > 0):
        return False  # a resumed run already sampled (or skipped) this step
    if step == 0:
        return s.sample_first
    return step % s.sample_every == 0 or step == s.total_steps


def train(run: Run, start_step: int) -> Outcome:
    s = run.settings
    step = last_saved = start_step
    while True:
        lr = lr_at(step, run.schedule)  # depends on the step alone: nothing to resume
        if should_sample(step, start_step, s) and not run.stop_requested():
            run.sample(step)
        if step > last_saved and (step % s.save_every == 0 or step == s.total_steps
                                  or run.stop_requested()):
            run.save(step)
            last_saved = step
        if run.stop_requested():
            return Outcome.STOPPED
        if step >= s.total_steps:
            return Outcome.FINISHED

        set_lr(run.optimizer, lr)
        run.optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in range(s.accumulation):
            batch = run.next_batch()
            loss = compute_loss(run.model, batch, step_generator(s.seed, step, micro),
                                s.timestep_type)
            value = check_finite(loss, step + 1)  # stop loudly; never zero a NaN away
            # Divide so accumulated gradients are the mean over micro-batches.
            (loss / s.accumulation).backward()
            step_loss += value / s.accumulation
        if s.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(run.params, s.max_grad_norm)
        run.optimizer.step()
        step += 1
        run.log(step, step_loss, lr)
