"""Loss masks: which pixels of a training image the loss looks at (upstream's masked loss).

Dataset keys (upstream's): `mask_path`, a folder of grayscale masks paired with the
images by file stem (`a.jpg` pairs with `masks/a.png`; any image type); or
`alpha_mask: true`, the image's own alpha channel. White (1) is trained, black (0) is
ignored. `invert_mask` swaps them; `mask_min_value` lifts black to that value
(m' = min + m * (1 - min)), so masked areas still train a little.

- A mask is read bounded like its image (dataset.open_image), turned upright by its
  EXIF orientation, resized to the size its image is resized to for its bucket
  (bilinear, whatever the mask's own size) and cropped like it, so the two stay
  pixel-aligned: (1, H, W) in [0, 1] at the bucket; a `flip_x`/`flip_y` copy's mask is
  mirrored with it.
- An image without a mask (none of its stem in the folder, an unreadable file, no alpha
  channel) is reported once, at the start, and trains unmasked (a mask of ones), like
  a missing caption; a mask folder that does not exist stops the job (exit 2).
- Batches carry `mask` (B, 1, H, W) when any dataset of the process has masks, else
  None. The loss brings it to the latent grid (`latent_weights`).

Upstream also blurs each mask by a random radius (up to 0.5% of its short side); that
draw would come from a generator shared with the rest of the step, so aitk does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from aitk.data.augment import flip
from aitk.data.buckets import ResizeCrop, resize_crop
from aitk.data.controls import UNREADABLE, index_folder
from aitk.data.dataset import Item, open_image


@dataclass(frozen=True)
class MaskRule:
    """One dataset's mask settings."""

    folder: Path | None = None  # mask_path
    alpha: bool = False  # alpha_mask: the image's alpha channel
    invert: bool = False
    min_value: float = 0.0

    @classmethod
    def of(cls, dataset: Any) -> MaskRule | None:
        """A dataset config's rule; None when it has no masks."""
        folder = getattr(dataset, "mask_path", None)
        alpha = bool(getattr(dataset, "alpha_mask", False))
        if not folder and not alpha:
            return None
        return cls(Path(folder).expanduser() if folder and not alpha else None, alpha,
                   bool(getattr(dataset, "invert_mask", False)),
                   float(getattr(dataset, "mask_min_value", 0.0) or 0.0))


def mask_pixels(image: Image.Image, item: Item, rule: MaskRule,
                plan: ResizeCrop | None = None) -> torch.Tensor:
    """(1, H, W) float32 in [0, 1] at the item's bucket, from an open mask (or, with
    `alpha`, the open training image), resized and cropped by its image's `plan` (None:
    the centre crop)."""
    image = ImageOps.exif_transpose(image)
    gray = image.getchannel("A") if rule.alpha else image.convert("L")
    gray = flip(gray, *item.flips)  # a flip_x/flip_y copy: as its pixels, before the resize
    plan = plan or resize_crop(*item.size, item.bucket)
    if gray.size != (plan.resize_w, plan.resize_h):
        gray = gray.resize((plan.resize_w, plan.resize_h), Image.Resampling.BILINEAR)
    gray = gray.crop((plan.left, plan.top, plan.left + plan.width, plan.top + plan.height))
    mask = torch.from_numpy(np.asarray(gray, dtype=np.float32) / 255.0)[None]
    if rule.invert:
        mask = 1.0 - mask
    return rule.min_value + mask * (1.0 - rule.min_value)


class Masks:
    """The masks of one process's items; `attach(batch)` adds them to a batch."""

    def __init__(self, rules: Sequence[MaskRule | None], items: Sequence[Item],
                 report: Callable[[str], None]) -> None:
        self.rules = list(rules)
        self.report = report
        self._indexes = {r.folder: index_folder(r.folder) for r in self.rules
                         if r is not None and r.folder is not None}
        # Each image's mask file (or the image itself for alpha), None: unmasked.
        self.sources: dict[tuple[int, Path], Path | None] = {}
        for item in items:
            key = (item.dataset, item.path)
            if key not in self.sources:
                self.sources[key] = self._find(item)

    @property
    def active(self) -> bool:
        return any(r is not None for r in self.rules)

    def _rule(self, item: Item) -> MaskRule | None:
        return self.rules[item.dataset] if item.dataset < len(self.rules) else None

    def _find(self, item: Item) -> Path | None:
        rule = self._rule(item)
        if rule is None:
            return None
        if rule.alpha:
            source, what = item.path, "alpha mask"
        else:
            assert rule.folder is not None
            source = self._indexes[rule.folder].get(item.path.stem)
            if source is None:
                self.report(f"{item.path}: no mask {item.path.stem}.* in {rule.folder}; "
                            "trained unmasked")
                return None
            what = "mask"
        try:
            with open_image(source) as img:
                if rule.alpha and "A" not in img.getbands():
                    self.report(f"{item.path}: alpha_mask is set but the image has no "
                                "alpha channel; trained unmasked")
                    return None
                img.load()
        except UNREADABLE as exc:
            self.report(f"{source}: unreadable {what} ({exc.__class__.__name__}); "
                        f"{item.path.name} trained unmasked")
            return None
        return source

    def load(self, item: Item, plan: ResizeCrop | None = None) -> torch.Tensor:
        """(1, H, W) at the item's bucket; ones when it has no (readable) mask."""
        w, h = item.bucket
        source, rule = self.sources.get((item.dataset, item.path)), self._rule(item)
        if source is None or rule is None:
            return torch.ones(1, h, w)
        try:
            with open_image(source) as img:
                return mask_pixels(img, item, rule, plan)
        except UNREADABLE as exc:  # changed since the start: the same report, once
            self.report(f"{source}: unreadable mask ({exc.__class__.__name__}); "
                        f"{item.path.name} trained unmasked")
            self.sources[(item.dataset, item.path)] = None
            return torch.ones(1, h, w)

    def attach(self, batch: Any) -> Any:
        """The batch with `mask` (B, 1, H, W) set from its items."""
        if self.active and batch.items:
            plans = batch.crops or [None] * len(batch.items)
            batch.mask = torch.stack([self.load(i, p) for i, p in zip(batch.items, plans,
                                                                       strict=True)])
        return batch


def latent_weights(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A batch's pixel mask (B, 1, H, W) -> weights on the latent grid of `like`
    ((B, C, h, w), or (B, C, f, h, w) for video: the same mask on every frame). Each
    latent cell gets the mean of the pixels it covers, so a cell is 0 only where all of
    them are masked out."""
    h, w = like.shape[-2:]
    cells = F.interpolate(mask.float(), size=(h, w), mode="area")
    if like.ndim == 5:
        cells = cells.unsqueeze(2)
    return cells.to(like.device)
