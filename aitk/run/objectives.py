"""What one micro-step minimises: the diffusion loss of the adapter's prediction plus the
terms a config switches on, each a named piece that `Objective` sums (the loop calls it
through aitk.run.train.compute_loss).

    draw        noise and timesteps from the step's generator (the schedule's), the
                noisy latents, the model's conditioning, the batch's embeddings
    NextSample  `timestep_type: next_sample`: a no-grad prediction steps the noisy
                latents to the next level of a short sampling schedule; the step trains
                there, with the noise that level implies
    Guidance    `do_guidance_loss`: the target pushed away from an unconditional
                prediction, and a guidance-distilled model's guidance embedding fed
                the same scale in every pass of the step
    Diffusion   the main term: `loss_type`'s error against the target, weighted by the
                batch's masks and per item by the schedule (aitk.diffusion.losses)
    Preservation  `diff_output_preservation` / `blank_prompt_preservation`: the
                adapter's prediction on the class (or empty) prompt held to the base
                model's prediction for it
    InvertedMaskPrior  `inverted_mask_prior`: where the mask is 0, the adapter's
                prediction held to the base model's for the batch's own prompt
    max_loss    the diffusion loss clamped at `train.max_loss` (no gradient above it)
    prior_reg   a `prior_reg` dataset's batch (aitk.data.batches): the target is the
                base model's own prediction, so the adapter learns to leave it alone
    side loss   what the main prediction predicted besides the latents (LTX-2's audio
                stream, `do_audio`), scored and weighted by the model
                (BaseModel.side_loss), added as it is

A prior (the base model alone) runs with the adapter disabled (AdapterNetwork.disabled),
in eval mode and without gradients, on the step's own noisy latents and timesteps: it
draws no random numbers, so the step's draws still depend on (seed, step, micro-step)
alone and resume stays exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from aitk.data.batch import DataBatch
from aitk.data.masks import latent_weights
from aitk.diffusion import losses
from aitk.diffusion.losses import Noised
from aitk.errors import ObjectiveError
from aitk.models.base import BaseModel
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

# (captions, batch) -> the batch's embeddings for other captions, from the same cache
# (aitk.run.caches.Inputs.reembed)
Reembed = Callable[..., AdvancedPromptEmbeds]  # (captions, batch[, blanks])


class Adapter(Protocol):
    def disabled(self) -> contextlib.AbstractContextManager[None]:
        ...


class Scalable(Protocol):
    """An adapter whose strength can be set (aitk.adapters.network.AdapterNetwork)."""

    multiplier: float

    def set_multiplier(self, scale: float) -> None:
        ...


@contextlib.contextmanager
def network_weight(network: Scalable | None, weight: float) -> Iterator[None]:
    """A dataset's `network_weight` (upstream's): the adapter's multiplier times
    `weight` for its batch's whole step (0: the base model's output, 0.5: half the
    LoRA's change), then as it was, even on error."""
    if network is None or weight == 1.0:
        yield
        return
    was = network.multiplier
    network.set_multiplier(was * weight)
    try:
        yield
    finally:
        network.set_multiplier(was)


@dataclass(frozen=True)
class Step:
    """One micro-step's draws, what the model is fed and the batch's embeddings."""

    x: Noised
    model_input: torch.Tensor
    embeds: AdvancedPromptEmbeds


@contextlib.contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside the block (no dropout: a prior draws nothing), each submodule's
    train/eval flag restored after it."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def draw(model: BaseModel, batch: DataBatch, generator: torch.Generator) -> Step:
    """Noise, then timesteps, from the step's generator (in that order: resume is exact
    because nothing else draws from it), mixed and conditioned."""
    assert batch.latents is not None and batch.prompt_embeds is not None
    schedule = model.training_schedule
    clean = batch.latents.to(model.device, model.dtype)
    noise = schedule.sample_noise(clean, generator)
    timesteps = schedule.sample_timesteps(clean, generator)
    noisy = model.add_noise(clean, noise, timesteps)
    embeds = batch.prompt_embeds.to(model.device, model.dtype)
    return Step(Noised(clean, noise, timesteps, noisy),
                model.condition_noisy_latents(noisy, batch), embeds)


def predict(model: BaseModel, batch: DataBatch, step: Step,
            embeds: AdvancedPromptEmbeds | None = None) -> torch.Tensor:
    return model.get_noise_prediction(step.model_input, step.x.timesteps,
                                      step.embeds if embeds is None else embeds,
                                      batch=batch)


def prior(model: BaseModel, adapter: Adapter, batch: DataBatch, step: Step,
          embeds: AdvancedPromptEmbeds | None = None) -> torch.Tensor:
    """The base model's own prediction for this step (no adapter, no gradients)."""
    with torch.no_grad(), adapter.disabled(), evaluating(model.get_model_to_train()):
        return predict(model, batch, step, embeds).detach()


def predicted_clean(model: BaseModel) -> Callable[..., torch.Tensor] | None:
    return getattr(model.training_schedule, "predicted_clean", None)


# ---- the trajectory and the target ------------------------------------------------------
@dataclass(frozen=True)
class NextSample:
    """`timestep_type: next_sample`: step from the drawn level to the next one of the
    short schedule with the model's own prediction (adapter on, no gradients, eval
    mode), and train at the stepped latents, with the noise that makes them x_t' of the
    clean latents: noise' = (x_t' - (1 - s') clean) / s'."""

    def __call__(self, model: BaseModel, batch: DataBatch, step: Step) -> Step:
        schedule, x = model.training_schedule, step.x
        with torch.no_grad(), evaluating(model.get_model_to_train()):
            pred = predict(model, batch, step)
        t_next = schedule.next_timesteps(x.clean, x.timesteps)  # type: ignore[attr-defined]
        view = (-1, *([1] * (x.clean.ndim - 1)))
        s, s_next = x.timesteps.float().view(view) / 1000.0, t_next.float().view(view) / 1000.0
        clean_hat = schedule.predicted_clean(x.noisy, pred, x.timesteps)  # type: ignore[attr-defined]
        noise_hat = (x.noisy.float() - (1.0 - s) * clean_hat) / s
        stepped = (1.0 - s_next) * clean_hat + s_next * noise_hat
        noise = (stepped - (1.0 - s_next) * x.clean.float()) / s_next
        x = Noised(x.clean, noise.to(x.noise.dtype), t_next, stepped.to(x.noisy.dtype))
        return replace(step, x=x, model_input=model.condition_noisy_latents(x.noisy, batch))


@dataclass(frozen=True)
class Guidance:
    """`do_guidance_loss` (upstream's): the target becomes u + g (target - u), u the
    prediction (adapter on, no gradients) for `unconditional_prompt`, so the adapter
    learns to give alone what guidance scale g would give. `target`: g, or [lo, hi] for
    one g per item drawn from the step's generator after the timesteps; `schedule:
    sigma` lowers g toward 1 with the noise level (1 + (g - 1) s); `cfg_zero` scales u
    first by CFG-Zero*'s projection <target, u> / |u|^2. Guidance-distilled models
    (Flux dev) get g as their guidance embedding in every pass of the step."""

    embed: Reembed
    target: float | tuple[float, float] = 3.0
    schedule: str = "constant"
    cfg_zero: bool = False
    prompt: str = ""

    def scales(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        if isinstance(self.target, tuple):
            lo, hi = self.target
            return lo + (hi - lo) * torch.rand(batch_size, generator=generator)
        return torch.full((batch_size,), float(self.target))

    def __call__(self, model: BaseModel, batch: DataBatch, step: Step,
                 target: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        embeds = self.embed([self.prompt] * len(batch), batch).to(model.device, model.dtype)
        with torch.no_grad():
            uncond = predict(model, batch, step, embeds).float()
        target = target.float()
        view = (-1, *([1] * (target.ndim - 1)))
        if self.cfg_zero:
            flat_t, flat_u = target.flatten(1), uncond.flatten(1)
            alpha = (flat_t * flat_u).sum(1) / (flat_u.pow(2).sum(1) + 1e-8)
            uncond = uncond * alpha.view(view)
        g = scales.to(target.device, torch.float32).view(view)
        if self.schedule == "sigma":
            g = 1.0 + (g - 1.0) * (step.x.timesteps.float() / 1000.0).view(view)
        return (uncond + g * (target - uncond)).detach()


# ---- loss terms ---------------------------------------------------------------------------
class Term(Protocol):
    name: str

    def __call__(self, model: BaseModel, batch: DataBatch, step: Step,
                 pred: torch.Tensor) -> torch.Tensor:
        ...


def mask_weights(batch: DataBatch, like: torch.Tensor) -> torch.Tensor | None:
    """The batch's masks on the latent grid, scaled to a mean of 1 over the batch (as
    upstream), so masking changes where the loss looks, not its size; None without
    masks, zeros for a batch that is masked out entirely."""
    if batch.mask is None:
        return None
    weights = latent_weights(batch.mask, like)
    mean = weights.mean()
    return weights / mean if mean > 0 else weights


@dataclass(frozen=True)
class Diffusion:
    """The main term: `loss_type` against the target, masked, weighted per item."""

    loss_type: str = "mse"
    name: str = "diffusion"

    def __call__(self, model: BaseModel, batch: DataBatch, step: Step, pred: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor:
        # per item: the schedule's weight times the dataset's (loss_multiplier, reg_weight)
        item_weights = batch.weigh(model.training_schedule.loss_weights(step.x.timesteps))
        return losses.diffusion_loss(
            self.loss_type, pred, target, step.x, weights=mask_weights(batch, pred),
            item_weights=item_weights,
            predicted_clean=predicted_clean(model))


@dataclass(frozen=True)
class Preservation:
    """The adapter's prediction for each item's preservation prompt (None: the item is
    left out) held to the base model's prediction for it, mean squared error times
    `multiplier`: the class word (or the empty prompt) keeps meaning what it meant
    before training, so the trigger word alone learns the subject."""

    name: str
    prompts: Callable[[DataBatch], list[str | None]]
    embed: Reembed
    adapter: Adapter
    multiplier: float = 1.0
    # diff_output_preservation: its prompts take train.prompt_dropout_prob's own draw
    # (DataBatch.preservation_blanks), as upstream encodes them with dropout
    dropout: bool = False

    def __call__(self, model: BaseModel, batch: DataBatch, step: Step,
                 pred: torch.Tensor) -> torch.Tensor:
        prompts = self.prompts(batch)
        on = torch.tensor([p is not None for p in prompts], dtype=torch.float32)
        if not on.any():
            return pred.new_zeros((), dtype=torch.float32)
        texts = [p or "" for p in prompts]
        blanks = batch.preservation_blanks if self.dropout else None
        embeds = (self.embed(texts, batch) if blanks is None
                  else self.embed(texts, batch, blanks)).to(model.device, model.dtype)
        base = prior(model, self.adapter, batch, step, embeds)
        preserved = predict(model, batch, step, embeds)
        per_item = (preserved.float() - base.float()).pow(2).flatten(1).mean(1)
        return (per_item * on.to(per_item.device)).mean() * self.multiplier


@dataclass(frozen=True)
class InvertedMaskPrior:
    """Where a mask is 0 the adapter's prediction is held to the base model's for the
    batch's own prompt (mse, or mae with `loss_type: mae`, as upstream), weighted by
    1 - mask scaled to a mean of 1, times `multiplier`: what the mask leaves out is
    kept as the base model draws it."""

    adapter: Adapter
    multiplier: float = 0.5
    loss_type: str = "mse"
    name: str = "inverted_mask_prior"

    def __call__(self, model: BaseModel, batch: DataBatch, step: Step,
                 pred: torch.Tensor) -> torch.Tensor:
        if batch.mask is None:
            return pred.new_zeros((), dtype=torch.float32)
        outside = 1.0 - latent_weights(batch.mask, pred)
        mean = outside.mean()
        if mean <= 0:  # nothing masked out in this batch
            return pred.new_zeros((), dtype=torch.float32)
        base = prior(model, self.adapter, batch, step)
        kind = "mae" if self.loss_type == "mae" else "mse"
        return losses.diffusion_loss(kind, pred, base, weights=outside / mean) \
            * self.multiplier


# ---- the objective ------------------------------------------------------------------------
@dataclass(frozen=True)
class Objective:
    """The whole loss of a micro-step; `Objective()` is the plain diffusion loss.
    `adapter`: set when a dataset is `prior_reg`, whose batches target the prior.
    `network`: set when a dataset has a `network_weight`, which scales the adapter for
    its batches (DataBatch.network_weight)."""

    main: Diffusion = Diffusion()
    terms: tuple[Term, ...] = ()
    trajectory: NextSample | None = None
    guidance: Guidance | None = None
    adapter: Adapter | None = None
    # `max_loss` (upstream's): the diffusion loss (with the inverted-mask prior, which
    # upstream sums into it) clamped there, so a step above it adds no gradient; the
    # preservation terms are added after, as upstream adds them.
    max_loss: float | None = None
    network: Scalable | None = None

    def __call__(self, model: BaseModel, batch: DataBatch, generator: torch.Generator
                 ) -> torch.Tensor:
        step = draw(model, batch, generator)
        scales = (self.guidance.scales(len(batch), generator)
                  if self.guidance is not None else None)
        with model.guidance_as(scales), network_weight(self.network, batch.network_weight):
            if self.trajectory is not None:
                step = self.trajectory(model, batch, step)
            pred = predict(model, batch, step)
            side = model.side_loss()  # now: the passes below predict again
            x = step.x
            target = model.get_loss_target(noise=x.noise, batch=batch, clean_latents=x.clean,
                                           timesteps=x.timesteps)
            if batch.prior_reg:
                if self.adapter is None:
                    raise ObjectiveError("a prior_reg batch needs the objective built "
                                         "with its adapter (build_objective)")
                target = prior(model, self.adapter, batch, step)
            elif self.guidance is not None:
                assert scales is not None
                target = self.guidance(model, batch, step, target, scales)
            loss = self.main(model, batch, step, pred, target)
            if self.max_loss is None:
                for term in self.terms:
                    loss = loss + term(model, batch, step, pred)
            else:
                after = [t for t in self.terms if not isinstance(t, InvertedMaskPrior)]
                for term in self.terms:
                    if isinstance(term, InvertedMaskPrior):
                        loss = loss + term(model, batch, step, pred)
                loss = loss.clamp(max=self.max_loss)
                for term in after:
                    loss = loss + term(model, batch, step, pred)
            if side is not None:
                loss = loss + side
        return loss


PLAIN = Objective()


# ---- from the config ----------------------------------------------------------------------
def preservation_caption(caption: str, trigger: str | None, word: str) -> str:
    """`diff_output_preservation`: the caption with its trigger word replaced by the
    class word (upstream's replacement on the final caption, so token order matches)."""
    return caption.replace(trigger, word) if trigger else caption


@dataclass(frozen=True)
class PreservationRule:
    """One dataset's `diff_output_preservation` settings (None: off for its items)."""

    trigger: str | None
    word: str


def preservation_rules(proc: Any) -> list[PreservationRule | None]:
    """Per dataset: on when `train.diff_output_preservation` or the dataset's own switch
    is; the dataset's class word wins over the train section's."""
    tr = proc.train
    out: list[PreservationRule | None] = []
    for ds in proc.datasets:
        on = tr.diff_output_preservation or ds.diff_output_preservation
        word = ds.diff_output_preservation_class or tr.diff_output_preservation_class
        out.append(PreservationRule(ds.trigger_word or proc.trigger_word, word)
                   if on else None)
    return out


def extra_captions(proc: Any) -> Callable[[Any], list[str]]:
    """The captions the objective may embed for an item besides its own (cached with
    them): its preservation caption (the empty caption's is the empty caption), the
    empty prompt for blank-prompt preservation, the unconditional prompt."""
    rules = preservation_rules(proc)
    tr = proc.train
    fixed = ([""] if tr.blank_prompt_preservation else []) + \
        ([tr.unconditional_prompt] if tr.do_guidance_loss else [])

    def captions(item: Any) -> list[str]:
        rule = rules[item.dataset] if item.dataset < len(rules) else None
        own = [preservation_caption(item.caption, rule.trigger, rule.word)] if rule else []
        return [*own, *fixed]

    return captions


def check_objective(train: Any, model: BaseModel) -> None:
    """Refuse (ObjectiveError, exit 2) a setting this model's noise schedule cannot
    train: `stepped` and `next_sample` step along a flow, so they need a schedule that
    says which clean latents a prediction implies (`predicted_clean`)."""
    if predicted_clean(model) is not None:
        return
    for key, value in (("loss_type", "stepped"), ("timestep_type", "next_sample")):
        if getattr(train, key, None) == value:
            raise ObjectiveError(f"train.{key} {value} needs a flow-matching arch; "
                                 f"{model.arch} trains with DDPM noise: choose another "
                                 f"{key}")


def build_objective(proc: Any, model: BaseModel, adapter: Adapter, embed: Reembed
                    ) -> Objective:
    """The objective of a process's `train:` section."""
    tr = proc.train
    check_objective(tr, model)
    trajectory = NextSample() if tr.timestep_type == "next_sample" else None
    terms: list[Term] = []
    rules = preservation_rules(proc)
    if any(rules):
        def dop_prompts(batch: DataBatch) -> list[str | None]:
            out: list[str | None] = []
            for item, caption in zip(batch.items, batch.captions, strict=True):
                rule = rules[item.dataset] if item.dataset < len(rules) else None
                out.append(preservation_caption(caption, rule.trigger, rule.word)
                           if rule else None)
            return out

        terms.append(Preservation("diff_output_preservation", dop_prompts, embed, adapter,
                                  tr.diff_output_preservation_multiplier, dropout=True))
    if tr.blank_prompt_preservation:
        terms.append(Preservation("blank_prompt_preservation",
                                  lambda batch: [""] * len(batch), embed, adapter,
                                  tr.blank_prompt_preservation_multiplier))
    if tr.inverted_mask_prior:
        terms.append(InvertedMaskPrior(adapter, tr.inverted_mask_prior_multiplier,
                                       tr.loss_type))
    guidance = None
    if tr.do_guidance_loss:
        target = tr.guidance_loss_target
        guidance = Guidance(embed, tuple(target) if isinstance(target, list) else target,
                            tr.guidance_loss_schedule, tr.do_guidance_loss_cfg_zero,
                            tr.unconditional_prompt)
    prior_reg = any(ds.prior_reg for ds in proc.datasets)
    weighted = any(ds.network_weight != 1.0 for ds in proc.datasets)
    return Objective(Diffusion(tr.loss_type), tuple(terms), trajectory, guidance,
                     adapter if prior_reg else None, tr.max_loss,
                     adapter if weighted else None)  # type: ignore[arg-type]
