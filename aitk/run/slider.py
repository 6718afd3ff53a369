"""Slider losses: a LoRA that moves one concept along a direction, +1 one way and -1 the
other (Gandikota et al., "Concept Sliders", 2023), as the loop's objective
(an aitk.run.train.StepObjective) in place of the denoising loss.

At a noisy latent x_t the frozen model (adapter off) predicts for the target class c,
the positive prompt c+ and the negative c- (and, when set, an anchor a). The adapter is
then trained so that, for c,

    at +m:  pred(x_t, c) -> neutral + s * (pred(c+) - pred(c-))
    at -m:  pred(x_t, c) -> neutral - s * (pred(c+) - pred(c-))

and the anchor's prediction stays the frozen one at both polarities. Each polarity is
backpropagated on its own, with the adapter's multiplier set, because gradient
checkpointing recomputes the forward pass during backward and must see the same
multiplier.

- `concept_slider` (upstream's ConceptSliderTrainer): x_t from the datasets' images,
  noised as in training; neutral = pred(c); s = guidance_strength; both targets scaled
  to the neutral prediction's mean and spread; each polarity's loss is
  (2 * mse + anchor_strength * anchor mse) / 3 (upstream's enhance and erase terms are
  the same target here), the step's loss the mean of both.
- `slider` (upstream's TrainSliderProcess, `job: train`): x_t made by denoising pure
  noise (adapter off, conditioned on c) for a seeded number of `max_denoising_steps`,
  or from the datasets' images when the process has datasets; neutral = pred("");
  s = 1; each step one target (seeded), at +-its multiplier, weighted by its weight;
  anchors keep their frozen prediction at the same multipliers, weighted by their
  `multiplier`.

Every prompt is embedded once before the loop (`slider_prompts`; the text encoder may
be unloaded after); a target with `shuffle` gets up to SHUFFLES seeded orders of its
comma-separated parts, as upstream does. Every draw (target, resolution, stop step,
noise) comes from the step's generator, so a resumed slider run trains exactly as an
uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from aitk.config.schema import ConceptSliderSettings
from aitk.config.slider import SliderProcess, SliderTarget
from aitk.data.batch import DataBatch
from aitk.models.base import BaseModel
from aitk.models.prompt_embeds import AdvancedPromptEmbeds


def norm_like(tensor: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """`tensor` shifted and scaled to `reference`'s mean and standard deviation."""
    return (tensor - tensor.mean()) / (tensor.std() + 1e-8) * reference.std() + \
        reference.mean()


def slider_targets(neutral: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                   strength: float, normalize: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the +1 target, the -1 target): neutral -+ strength * (positive - negative)."""
    direction = strength * (positive.float() - negative.float())
    plus, minus = neutral.float() + direction, neutral.float() - direction
    if normalize:
        plus, minus = norm_like(plus, neutral.float()), norm_like(minus, neutral.float())
    return plus, minus


def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(pred.float(), target.float())


@contextmanager
def adapter_off(network: Any) -> Iterator[None]:
    network.disable()
    try:
        yield
    finally:
        network.enable()


@dataclass
class Noised:
    """The latents a slider step trains on, with their timesteps."""

    latents: torch.Tensor  # the model's input (conditioned, e.g. control channels)
    timesteps: torch.Tensor


def noised_batch(model: BaseModel, batch: DataBatch, generator: torch.Generator) -> Noised:
    """The batch's clean latents noised as a training step does (aitk.run.train)."""
    schedule = model.training_schedule
    clean = batch.latents.to(model.device, model.dtype)
    noise = schedule.sample_noise(clean, generator)
    t = schedule.sample_timesteps(clean, generator)
    return Noised(model.condition_noisy_latents(model.add_noise(clean, noise, t), batch), t)


def predict(model: BaseModel, x: Noised, embeds: AdvancedPromptEmbeds,
            batch: DataBatch) -> torch.Tensor:
    return model.get_noise_prediction(x.latents, x.timesteps,
                                      embeds.expand_to_batch(x.latents.shape[0]), batch=batch)


SHUFFLES = 8  # orders per shuffled target (upstream's max_permutations)


def shuffled(prompt: str, generator: torch.Generator) -> str:
    """The comma-separated parts of `prompt` in a seeded order."""
    parts = [p.strip() for p in prompt.split(",") if p.strip()]
    order = torch.randperm(len(parts), generator=generator).tolist()
    return ", ".join(parts[i] for i in order)


def expanded_targets(targets: Sequence[SliderTarget], seed: int) -> list[SliderTarget]:
    """Each target; a shuffled one as SHUFFLES seeded orders of its prompts' parts."""
    generator = torch.Generator().manual_seed(seed)
    out: list[SliderTarget] = []
    for target in targets:
        if not target.shuffle:
            out.append(target)
            continue
        orders = {(shuffled(target.positive, generator), shuffled(target.negative, generator))
                  for _ in range(SHUFFLES)}
        out += [target.model_copy(update={"positive": p, "negative": n, "shuffle": False})
                for p, n in sorted(orders)]
    return out


def slider_prompts(proc: Any) -> list[str]:
    """Every prompt a slider process's loss embeds (before the loop)."""
    if getattr(proc, "type", None) == "concept_slider":
        s = proc.slider
        return [s.target_class, s.positive_prompt, s.negative_prompt,
                *([] if s.anchor_class is None else [s.anchor_class])]
    prompts = ["", *(a.prompt for a in proc.slider.anchors)]
    for t in expanded_targets(proc.slider.targets, proc.train.seed):
        prompts += [t.target_class, t.positive, t.negative]
    return list(dict.fromkeys(prompts))


class PolarizedLoss:
    """The +m then -m passes of a slider step, each backpropagated on its own."""

    def __init__(self, network: Any) -> None:
        self.network = network

    def run(self, model: BaseModel, x: Noised, batch: DataBatch,
            target_embeds: AdvancedPromptEmbeds,
            targets: tuple[torch.Tensor, torch.Tensor], multiplier: float, weight: float,
            anchors: Sequence[tuple[AdvancedPromptEmbeds, torch.Tensor, float]],
            divisor: float) -> torch.Tensor:
        """`anchors`: (embeds, the frozen prediction, multiplier x strength); `divisor`:
        the loss is divided by it before backward. Returns the mean loss (detached)."""
        total = torch.zeros((), device=model.device)
        try:
            for sign, target in ((1.0, targets[0]), (-1.0, targets[1])):
                self.network.set_multiplier(sign * multiplier)
                loss = weight * mse(predict(model, x, target_embeds, batch), target)
                for embeds, frozen, anchor_weight in anchors:
                    loss = loss + anchor_weight * mse(predict(model, x, embeds, batch), frozen)
                (loss / (2 * divisor)).backward()
                total = total + loss.detach() / 2
        finally:
            self.network.set_multiplier(1.0)
        return total


class ConceptSliderObjective:
    """`type: concept_slider`'s loss (see the module docstring); `embeds`: every
    slider_prompts() entry's."""

    def __init__(self, network: Any, settings: ConceptSliderSettings,
                 embeds: dict[str, AdvancedPromptEmbeds]) -> None:
        self.settings, self.passes = settings, PolarizedLoss(network)
        self.network, self.embeds = network, embeds

    def backward_step(self, model: BaseModel, batch: DataBatch, generator: torch.Generator,
                      accumulation: int) -> torch.Tensor:
        s, e = self.settings, self.embeds
        x = noised_batch(model, batch, generator)
        with torch.no_grad(), adapter_off(self.network):
            neutral = predict(model, x, e[s.target_class], batch)
            positive = predict(model, x, e[s.positive_prompt], batch)
            negative = predict(model, x, e[s.negative_prompt], batch)
            anchor = (predict(model, x, e[s.anchor_class], batch)
                      if s.anchor_class is not None else None)
        targets = slider_targets(neutral, positive, negative, s.guidance_strength,
                                 normalize=True)
        # upstream: (enhance + erase + anchor) / 3, its enhance and erase terms equal
        anchors = [] if anchor is None else [(e[s.anchor_class], anchor,
                                              s.anchor_strength / 3)]
        return self.passes.run(model, x, batch, e[s.target_class], targets, 1.0, 2 / 3,
                               anchors, accumulation)


def _draw(generator: torch.Generator, n: int) -> int:
    return int(torch.randint(0, n, (1,), generator=generator))


class SliderObjective:
    """`job: train`'s `slider` process loss (see the module docstring); `embeds`: every
    slider_prompts() entry's."""

    def __init__(self, network: Any, proc: SliderProcess,
                 embeds: dict[str, AdvancedPromptEmbeds]) -> None:
        self.proc, self.passes, self.network = proc, PolarizedLoss(network), network
        self.targets = expanded_targets(proc.slider.targets, proc.train.seed)
        self.embeds = embeds
        self._shapes: dict[tuple[int, int], torch.Size] = {}

    def latent_shape(self, model: BaseModel, width: int, height: int) -> torch.Size:
        """The latents of a width x height image (the VAE on a blank one, once)."""
        if (width, height) not in self._shapes:
            with torch.no_grad():
                blank = torch.zeros(1, 3, height, width, device=model.device)
                self._shapes[(width, height)] = model.encode_images(blank).shape
        return self._shapes[(width, height)]

    def denoised(self, model: BaseModel, target: AdvancedPromptEmbeds, batch: DataBatch,
                 generator: torch.Generator) -> Noised:
        """Pure noise denoised (adapter off) for a seeded number of the
        `max_denoising_steps`, on a seeded one of the resolutions."""
        width, height = self.proc.slider.resolutions[
            _draw(generator, len(self.proc.slider.resolutions))]
        total = self.proc.train.max_denoising_steps
        stop = 1 + _draw(generator, total - 1)  # 1 .. total-1 steps done
        shape = self.latent_shape(model, width, height)
        x = torch.randn(shape, generator=generator).to(model.device, model.dtype)
        grid = torch.linspace(1000.0, 0.0, total + 1)
        schedule = model.training_schedule
        for i in range(stop):
            t = grid[i].expand(shape[0]).to(model.device)
            step_in = Noised(model.condition_noisy_latents(x, batch), t)
            pred = predict(model, step_in, target, batch)
            x = schedule.denoise_step(x, pred, t, grid[i + 1].expand(shape[0]).to(model.device))
        t = grid[stop].expand(shape[0]).to(model.device)
        return Noised(model.condition_noisy_latents(x, batch), t)

    def backward_step(self, model: BaseModel, batch: DataBatch, generator: torch.Generator,
                      accumulation: int) -> torch.Tensor:
        cfg, e = self.proc.slider, self.embeds
        target = self.targets[_draw(generator, len(self.targets))]
        embeds = e[target.target_class]
        with torch.no_grad(), adapter_off(self.network):
            x = (noised_batch(model, batch, generator) if batch.latents is not None
                 else self.denoised(model, embeds, batch, generator))
            neutral = predict(model, x, e[""], batch)
            pos = predict(model, x, e[target.positive], batch)
            neg = predict(model, x, e[target.negative], batch)
            anchors = [(self.embeds[a.prompt], predict(model, x, self.embeds[a.prompt], batch),
                        a.multiplier) for a in cfg.anchors]
        targets = slider_targets(neutral, pos, neg, 1.0)
        return self.passes.run(model, x, batch, embeds, targets, target.multiplier,
                               target.weight, anchors, accumulation)
