"""Batches for the loop: seeded order -> captions (dropout, then the per-draw changes)
-> latents (cached, or encoded with the draw's augments) and embeds.

Each dataset's settings (`DatasetRules`) apply to its items; a batch never mixes
datasets (as upstream), so it has one batch size, one set of rules and one loss weight.

Regularization datasets (`is_reg`, upstream's meaning): their items have their own
batch order, and every other optimizer step (steps 0, 2, 4, ...) takes its batches from
them; their loss counts `train.reg_weight` times (times the dataset's
`loss_multiplier`). A `prior_reg` dataset's batches are trained toward the base model's
own prediction (the adapter switched off) instead of the usual target, which keeps the
adapter from changing what the model does for them (aitk.run.train).

Every draw (order, caption dropout, caption changes, prompt dropout, augments, random
crops, which source a step uses) is keyed by the seed and the position in the order,
and the position is all the state, so a resumed run draws exactly what an
uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from aitk.data.augment import augment
from aitk.data.batch import DataBatch
from aitk.data.buckets import BatchSampler, Group, ResizeCrop, random_resize_crop, resize_crop
from aitk.data.captions import CaptionRules, dropped_prompts, embed_blanked, vary_batch
from aitk.data.controls import ControlEmbeds, control_batch
from aitk.data.dataset import DatasetError, Item, dropped_captions, load_pixels
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

TRAIN, REG = 0, 1  # the two batch orders (streams of draws)


@dataclass(frozen=True)
class DatasetRules:
    """What one dataset's items do at each draw (from its config section)."""

    batch_size: int = 1
    captions: CaptionRules = field(default_factory=CaptionRules)
    augments: tuple[str, ...] = ()
    random_crop: bool = False  # random_crop (or random_scale): a crop drawn per draw
    random_scale: bool = False  # and the zoom drawn too
    is_reg: bool = False
    prior_reg: bool = False
    loss_weight: float = 1.0  # loss_multiplier, times reg_weight for a reg dataset
    network_weight: float = 1.0  # the adapter's strength for its batches


class BatchSource:
    """`next()` gives a ready DataBatch; `state_dict()` is the data-order position."""

    def __init__(self, items: Sequence[Item], batch_size: int, seed: int,
                 latents: Callable[[Sequence[Item]], torch.Tensor] | None,
                 encode_images: Callable[[torch.Tensor], torch.Tensor],
                 embeds: Callable[..., AdvancedPromptEmbeds],
                 control_embeds: ControlEmbeds | None = None,
                 rules: Sequence[DatasetRules] | None = None,
                 accumulation: int = 1,
                 audio: Callable[[Item], torch.Tensor | None] | None = None,
                 prompt_dropout: float = 0.0, prompt_encoders: int = 1) -> None:
        self.seed = seed
        # train.prompt_dropout_prob, 0 unless the prompts are embedded live (then `embeds`
        # takes the draw too); the draws per item: the model's prompt_dropout_encoders.
        self.prompt_dropout = prompt_dropout
        self.prompt_encoders = prompt_encoders
        self._audio = audio  # archs that train sound: a clip's audio latents
        self.rules = list(rules) if rules is not None else []
        self.accumulation = accumulation
        everything = list(items)
        self.items = [i for i in everything if not self._rules(i).is_reg]
        self.reg_items = [i for i in everything if self._rules(i).is_reg]
        if not self.items:
            raise DatasetError("every dataset is a regularization dataset (is_reg); at "
                               "least one must hold the images to learn")
        size = self._batch_size(batch_size)
        self.sampler = BatchSampler([i.group for i in self.items], size, seed)
        self.reg_sampler = (BatchSampler([i.group for i in self.reg_items], size, seed,
                                         stream=REG) if self.reg_items else None)
        self._latents = latents
        self._encode = encode_images
        self._embeds = embeds
        # Edit models whose text embeddings read the control images (data.controls).
        self._control_embeds = control_embeds
        self.epoch = 0
        self.calls = 0  # micro-steps drawn so far: which order the next one uses

    def _rules(self, item: Item) -> DatasetRules:
        return self.rules[item.dataset] if item.dataset < len(self.rules) else DatasetRules()

    def _batch_size(self, default: int) -> int | Callable[[Group], int]:
        if not self.rules:
            return default
        sizes = [r.batch_size for r in self.rules]
        return lambda group: sizes[group[0]]

    def _stream(self) -> int:
        """Regularization batches on even optimizer steps, as upstream."""
        step = self.calls // self.accumulation
        return REG if self.reg_sampler is not None and step % 2 == 0 else TRAIN

    def _batch(self, stream: int) -> DataBatch:
        sampler = self.reg_sampler if stream == REG else self.sampler
        assert sampler is not None
        pool = self.reg_items if stream == REG else self.items
        epoch, index, ids = sampler.next()
        if stream == TRAIN:
            self.epoch = epoch
        items = [pool[i] for i in ids]
        rules = self._rules(items[0])  # one dataset per batch
        drops = dropped_captions(self.seed, epoch, index,
                                 [i.caption_dropout_rate for i in items], stream)
        captions = ["" if d else i.caption for d, i in zip(drops, items, strict=True)]
        captions = vary_batch(captions, [rules.captions] * len(items), self.seed, stream,
                              epoch, index)
        plans = [self._plan(item, rules, stream, epoch, index, k)
                 for k, item in enumerate(items)]
        if self._latents is not None and not rules.augments and not rules.random_crop:
            latents = self._latents(items)
        else:
            with torch.no_grad():
                latents = self._encode(torch.stack([
                    load_pixels(item, self._augmenter(rules, stream, epoch, index, k), plan)
                    for k, (item, plan) in enumerate(zip(items, plans, strict=True))]))
        sounds = None
        if self._audio is not None and any(i.audio is not None for i in items):
            sounds = [self._audio(i) for i in items]
            sounds = sounds if any(s is not None for s in sounds) else None
        controls = control_batch(items)
        blanks = dropped_prompts(self.seed, epoch, index, self.prompt_dropout,
                                 items=len(items), encoders=self.prompt_encoders,
                                 stream=stream)
        control_embeds = self._control_embeds
        prompt_embeds = embed_blanked(
            captions, blanks, self._embeds,
            None if controls is None or control_embeds is None else
            lambda texts: control_embeds(texts, items, controls))
        return DataBatch(captions=captions, latents=latents, prompt_embeds=prompt_embeds,
                         control_tensor=None if controls is None else controls[0],
                         control_tensor_list=controls,
                         file_paths=[str(i.path) for i in items],
                         original_sizes=[(i.size[1], i.size[0]) for i in items],
                         crop_coords_top_left=[(p.top, p.left) for p in plans],
                         crops=plans if rules.random_crop else None,
                         items=items,
                         loss_weights=None if rules.loss_weight == 1.0 else
                         [rules.loss_weight] * len(items),
                         prior_reg=rules.prior_reg, audio_latents=sounds,
                         network_weight=rules.network_weight, prompt_blanks=blanks,
                         preservation_blanks=dropped_prompts(
                             self.seed, epoch, index, self.prompt_dropout, items=len(items),
                             encoders=self.prompt_encoders, stream=stream, pass_=1))

    def _plan(self, item: Item, rules: DatasetRules, stream: int, epoch: int, index: int,
              position: int) -> ResizeCrop:
        """The item's resize and crop for this draw: the centre, or a random_crop draw
        keyed by (seed, stream, epoch, batch, position) -- resumable."""
        if not rules.random_crop:
            return resize_crop(*item.size, item.bucket)
        rng = np.random.default_rng([self.seed, stream, epoch, index, position, 17])
        return random_resize_crop(*item.size, item.bucket, rng, rules.random_scale)

    def _augmenter(self, rules: DatasetRules, stream: int, epoch: int, index: int,
                   position: int) -> Callable | None:
        if not rules.augments:
            return None
        rng = np.random.default_rng([self.seed, stream, epoch, index, position, 13])
        return lambda img: augment(img, rules.augments, rng)

    def next(self) -> DataBatch:
        return self.next_for(0, 1)

    def next_for(self, rank: int, world_size: int) -> DataBatch:
        """Rank `rank`'s batch of the next `world_size` in the shared order: every rank
        keeps the same position, so a checkpoint from any of them resumes any world."""
        stream = self._stream()
        self.calls += 1
        batch = None
        for r in range(world_size):
            if r == rank:
                batch = self._batch(stream)
            else:  # pass over another rank's batch without loading it
                sampler = self.reg_sampler if stream == REG else self.sampler
                assert sampler is not None
                epoch = sampler.next()[0]
                if stream == TRAIN:
                    self.epoch = epoch
        assert batch is not None
        return batch

    def state_dict(self) -> dict:
        state: dict = {**self.sampler.state_dict(), "calls": self.calls}
        if self.reg_sampler is not None:
            state["reg"] = self.reg_sampler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self.epoch = int(state["epoch"])
        self.calls = int(state.get("calls", 0))
        if self.reg_sampler is not None and "reg" in state:
            self.reg_sampler.load_state_dict(state["reg"])


class NoImages:
    """The batch source of a process without datasets (a slider that makes its own
    latents): empty batches, no order to resume."""

    epoch = 0

    def next_for(self, rank: int, world_size: int) -> DataBatch:
        return DataBatch(captions=[""])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Nothing to restore."""
