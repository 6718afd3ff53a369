"""Aspect-ratio buckets and the seeded, resumable batch order.

A bucket is the (width, height) an image is trained at: its own aspect ratio, sides
multiples of the model's divisibility, area at most resolution^2, never upscaled. Items
of one bucket batch together. The order of an epoch is a pure function of (seed, epoch),
so the sampler's whole state is two integers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Size = tuple[int, int]  # (width, height)
# What batches together: (dataset, width, height, frames); frames 0 for an image arch.
# The dataset index comes first and the frames last, so one image dataset keeps the
# order it had before either was added (they are the same for all its items).
Group = tuple[int, ...]
BatchSize = int | Callable[[Group], int]  # one for all, or per group (per dataset)


def bucket_for(width: int, height: int, resolution: int, divisibility: int,
               scale: float = 1.0, square: bool = False) -> Size | None:
    """The training size for an image, or None when it is smaller than one cell.

    Upstream's dataset keys: `scale` (<= 1) shrinks the image before it is bucketed, so
    an image whose scaled area is under resolution^2 trains at its scaled size;
    `square` (square_crop) trains at a square of side resolution (or the scaled short
    side, when smaller: aitk never upscales), which resize_crop centre-crops."""
    width, height = int(width * scale), int(height * scale)
    if width < 1 or height < 1:
        return None
    if square:
        side = min(resolution, width, height) // divisibility * divisibility
        return (side, side) if side >= divisibility else None
    fit = min(1.0, math.sqrt(resolution * resolution / (width * height)))
    bw = int(width * fit) // divisibility * divisibility
    bh = int(height * fit) // divisibility * divisibility
    if bw < divisibility or bh < divisibility:
        return None
    return bw, bh


@dataclass(frozen=True)
class ResizeCrop:
    """Resize to (resize_w, resize_h) -- never larger than the source -- then crop."""

    resize_w: int
    resize_h: int
    left: int
    top: int
    width: int
    height: int


def resize_crop(width: int, height: int, bucket: Size) -> ResizeCrop:
    bw, bh = bucket
    scale = max(bw / width, bh / height)  # <= 1: bucket_for never grows an image
    rw = min(width, max(bw, round(width * scale)))
    rh = min(height, max(bh, round(height * scale)))
    return ResizeCrop(rw, rh, (rw - bw) // 2, (rh - bh) // 2, bw, bh)


def random_resize_crop(width: int, height: int, bucket: Size, rng: Any,
                       rescale: bool = False) -> ResizeCrop:
    """One draw of upstream's `random_crop`: the bucket's crop at a random offset in the
    resized image instead of its centre. With `rescale` (`random_scale`, which implies
    random_crop, as upstream) the resize is drawn too: the short side a random whole
    number of pixels from the smallest that covers the bucket to the image's own (never
    upscaled), so the crop sees a random zoom of the image. `rng`: a numpy Generator."""
    plan = resize_crop(width, height, bucket)
    bw, bh = bucket
    rw, rh = plan.resize_w, plan.resize_h
    if rescale:
        short = min(width, height)
        low = min(short, math.ceil(short * max(bw / width, bh / height)))
        factor = int(rng.integers(low, short + 1)) / short
        rw = min(width, max(bw, round(width * factor)))
        rh = min(height, max(bh, round(height * factor)))
    left = int(rng.integers(0, rw - bw + 1))
    top = int(rng.integers(0, rh - bh + 1))
    return ResizeCrop(rw, rh, left, top, bw, bh)


def epoch_batches(buckets: Sequence[Group], batch_size: BatchSize, seed: int,
                  epoch: int, stream: int = 0) -> list[list[int]]:
    """Indices grouped into same-bucket batches, shuffled by (seed, epoch); `stream`
    keeps a second order (the regularization datasets') apart from the first."""
    import numpy as np  # here, not at the top: `run.py --check` sizes buckets without it

    rng = np.random.default_rng([seed, epoch] + ([stream] if stream else []))
    groups: dict[Group, list[int]] = defaultdict(list)
    for index, bucket in enumerate(buckets):
        groups[bucket].append(index)
    batches: list[list[int]] = []
    for bucket in sorted(groups):
        members = [groups[bucket][i] for i in rng.permutation(len(groups[bucket]))]
        size = batch_size(bucket) if callable(batch_size) else batch_size
        batches += [members[i:i + size] for i in range(0, len(members), size)]
    return [batches[i] for i in rng.permutation(len(batches))]


class BatchSampler:
    """Endless batches over epochs; `position` (epoch, index) is all its state."""

    def __init__(self, buckets: Sequence[Group], batch_size: BatchSize, seed: int,
                 stream: int = 0) -> None:
        if not buckets:
            raise ValueError("no items to sample")
        self.buckets = list(buckets)
        self.batch_size = batch_size
        self.seed = seed
        self.stream = stream
        self.epoch = 0
        self.index = 0
        self._order: list[list[int]] | None = None

    def _current(self) -> list[list[int]]:
        if self._order is None:
            self._order = epoch_batches(self.buckets, self.batch_size, self.seed, self.epoch,
                                        self.stream)
        return self._order

    def next(self) -> tuple[int, int, list[int]]:
        """(epoch, batch index within the epoch, item indices)."""
        order = self._current()
        if self.index >= len(order):
            self.epoch, self.index, self._order = self.epoch + 1, 0, None
            order = self._current()
        at = (self.epoch, self.index, order[self.index])
        self.index += 1
        return at

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index, self._order = int(state["epoch"]), int(state["index"]), None
