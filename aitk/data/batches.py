"""Batches for the loop: seeded order -> captions (with dropout) -> latents and embeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from aitk.data.batch import DataBatch
from aitk.data.buckets import BatchSampler, resize_crop
from aitk.data.controls import ControlEmbeds, control_batch
from aitk.data.dataset import Item, dropped_captions, load_pixels
from aitk.models.prompt_embeds import AdvancedPromptEmbeds


class BatchSource:
    """`next()` gives a ready DataBatch; `state_dict()` is the data-order position."""

    def __init__(self, items: Sequence[Item], batch_size: int, seed: int,
                 latents: Callable[[Sequence[Item]], torch.Tensor] | None,
                 encode_images: Callable[[torch.Tensor], torch.Tensor],
                 embeds: Callable[[list[str]], AdvancedPromptEmbeds],
                 control_embeds: ControlEmbeds | None = None) -> None:
        self.items = list(items)
        self.seed = seed
        self.sampler = BatchSampler([i.group for i in self.items], batch_size, seed)
        self._latents = latents
        self._encode = encode_images
        self._embeds = embeds
        # Edit models whose text embeddings read the control images (data.controls).
        self._control_embeds = control_embeds
        self.epoch = 0

    def next(self) -> DataBatch:
        epoch, index, ids = self.sampler.next()
        self.epoch = epoch
        items = [self.items[i] for i in ids]
        drops = dropped_captions(self.seed, epoch, index,
                                 [i.caption_dropout_rate for i in items])
        captions = ["" if d else i.caption for d, i in zip(drops, items, strict=True)]
        if self._latents is not None:
            latents = self._latents(items)
        else:
            with torch.no_grad():
                latents = self._encode(torch.stack([load_pixels(i) for i in items]))
        plans = [resize_crop(*i.size, i.bucket) for i in items]
        controls = control_batch(items)
        if controls is not None and self._control_embeds is not None:
            prompt_embeds = self._control_embeds(captions, items, controls)
        else:
            prompt_embeds = self._embeds(captions)
        return DataBatch(captions=captions, latents=latents, prompt_embeds=prompt_embeds,
                         control_tensor=None if controls is None else controls[0],
                         control_tensor_list=controls,
                         file_paths=[str(i.path) for i in items],
                         original_sizes=[(i.size[1], i.size[0]) for i in items],
                         crop_coords_top_left=[(p.top, p.left) for p in plans],
                         items=items)

    def skip(self) -> None:
        """Pass over one batch without loading it (another rank trains on it)."""
        self.epoch = self.sampler.next()[0]

    def next_for(self, rank: int, world_size: int) -> DataBatch:
        """Rank `rank`'s batch of the next `world_size` in the shared order: every rank
        keeps the same position, so a checkpoint from any of them resumes any world."""
        batch = None
        for r in range(world_size):
            if r == rank:
                batch = self.next()
            else:
                self.skip()
        assert batch is not None
        return batch

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)
        self.epoch = int(state["epoch"])
