"""Control (reference) images for edit models: pairing, loading, and text embeddings
that depend on them.

Dataset keys (upstream's): `control_path` (a folder, or a list of folders for several
references) and `control_path_1..3`; their folders are used in that order.

- Pairing: an image's control in each folder is the image file with the same stem
  (`a.jpg` pairs with `ctrl/a.png`; any image type). An image that lacks a control in
  any folder, or whose control cannot be read, is reported once and skipped, like an
  unreadable image; a control folder that does not exist stops the job (exit 2). Every
  image of one process has the same number of controls (a batch stacks them).
- Loading: a control is read bounded like a training image (dataset.open_image), turned
  upright by its EXIF orientation, resized to cover the item's bucket (LANCZOS, up or
  down: a control of another size than its image is resized, never refused) and centre
  cropped to exactly the bucket. A control of the image's own size gets the image's own
  resize and crop, so the pair stays pixel-aligned. Tensors are (3, H, W) in [0, 1].
- Batches carry `control_tensor_list` (one (B, 3, H, W) tensor per folder, in order)
  and `control_tensor` (the first).
- Text embeddings: a model whose embeddings read the control image
  (`encode_control_in_text_embeddings`, e.g. Qwen-Image-Edit) embeds each batch with its
  controls; its text-embed cache entries are keyed by the caption AND the content of
  each control file and the bucket (ControlTextEmbedCache), so an edited control never
  serves a stale embedding. Preview prompts are keyed by `prompt_key(text, ctrl_imgs)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from aitk.data.augment import flip
from aitk.data.buckets import Size
from aitk.data.dataset import Item, image_size, open_image
from aitk.data.folders import folder_entries, stem_index
from aitk.data.formats import IMAGE_EXTENSIONS
from aitk.errors import BadInputFile, DatasetError, PromptEmbedsFileError
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk_common.files import sha256_file

CACHE_FORMAT = "1"
UNREADABLE = (BadInputFile, OSError, UnidentifiedImageError, SyntaxError, ValueError,
              Image.DecompressionBombError)


def index_folder(folder: Path) -> dict[str, Path]:
    """stem -> control image; two files with one stem: the first by name wins."""
    if not folder.is_dir():
        raise DatasetError(f"control folder {folder} does not exist")
    return stem_index(p for p in folder_entries(folder)
                      if p.suffix.lower() in IMAGE_EXTENSIONS)


def pair_controls(items: Sequence[Item], folders: Sequence[Path],
                  report: Callable[[str], None] = print) -> list[Item]:
    """The items that have a readable control in every folder, with `controls` set."""
    if not folders:
        return list(items)
    indexes = [(folder, index_folder(folder)) for folder in folders]
    readable: dict[Path, bool] = {}
    out: list[Item] = []
    for item in items:
        controls: list[Path] = []
        for folder, index in indexes:
            path = index.get(item.path.stem)
            if path is None:
                report(f"{item.path}: no control image {item.path.stem}.* in {folder}; "
                       "skipped")
                break
            if path not in readable:
                readable[path] = _readable(path, report)
            if not readable[path]:
                report(f"{item.path}: its control image {path} is unreadable; skipped")
                break
            controls.append(path)
        else:
            out.append(dataclasses.replace(item, controls=tuple(controls)))
    if items and not out:
        raise DatasetError(f"no image of {items[0].path.parent} has a readable control "
                           f"image in {', '.join(map(str, folders))} (paired by file name)")
    return out


def _readable(path: Path, report: Callable[[str], None]) -> bool:
    try:
        image_size(path)
        return True
    except UNREADABLE as exc:
        report(f"{path}: unreadable control image ({exc.__class__.__name__}: {exc})")
        return False


def check_same_count(items: Sequence[Item]) -> None:
    counts = sorted({len(i.controls) for i in items})
    if len(counts) > 1:
        raise DatasetError(f"the datasets of one process have {' and '.join(map(str, counts))}"
                           " control images per image; give every dataset the same "
                           "number of control folders (a batch stacks them)")


def cover_crop(width: int, height: int, bucket: Size) -> tuple[int, int, int, int]:
    """(resize_w, resize_h, left, top): the smallest resize that covers the bucket, then
    a centre crop. For an image's own size it is dataset.load_pixels' resize and crop
    (buckets never upscale, so the two agree)."""
    bw, bh = bucket
    scale = max(bw / width, bh / height)
    rw, rh = max(bw, round(width * scale)), max(bh, round(height * scale))
    return rw, rh, (rw - bw) // 2, (rh - bh) // 2


def load_control(path: Path, bucket: Size, flips: tuple[bool, bool] = (False, False)
                 ) -> torch.Tensor:
    """(3, H, W) float32 in [0, 1] at `bucket` (width, height), mirrored like its image
    (a flip_x/flip_y copy, aitk.data.augment)."""
    with open_image(path) as img:
        img = flip(ImageOps.exif_transpose(img).convert("RGB"), *flips)
        rw, rh, left, top = cover_crop(img.width, img.height, bucket)
        if (rw, rh) != img.size:
            img = img.resize((rw, rh), Image.Resampling.LANCZOS)
        img = img.crop((left, top, left + bucket[0], top + bucket[1]))
        arr = np.asarray(img, dtype=np.float32)
    return torch.from_numpy(arr).permute(2, 0, 1) / 255.0


def control_batch(items: Sequence[Item]) -> list[torch.Tensor] | None:
    """One (B, 3, H, W) tensor per control folder; None when the items have none."""
    if not items or not items[0].controls:
        return None
    return [torch.stack([load_control(i.controls[k], i.bucket, i.flips) for i in items])
            for k in range(len(items[0].controls))]


def open_sample_control(path: str) -> Image.Image:
    """A preview's ctrl_img file as an upright RGB image, read bounded."""
    with open_image(Path(path).expanduser()) as img:
        return ImageOps.exif_transpose(img).convert("RGB")


def load_sample_controls(paths: Sequence[str]) -> list[torch.Tensor]:
    """A preview's ctrl_img files as (1, 3, H, W) in [0, 1] at their own size."""
    out = []
    for p in paths:
        arr = np.asarray(open_sample_control(p), dtype=np.float32)
        out.append(torch.from_numpy(arr).permute(2, 0, 1)[None] / 255.0)
    return out


def prompt_key(text: str, ctrl_imgs: Sequence[str]) -> str:
    """The key of a preview prompt's embeds: the text alone without controls."""
    return json.dumps([text, *ctrl_imgs]) if ctrl_imgs else text


def control_text_key(caption: str, control_digests: Sequence[str], bucket: Size,
                     model_identity: str, space_version: str,
                     flips: tuple[bool, bool] = (False, False)) -> str:
    payload = {"kind": "text+control", "format": CACHE_FORMAT, "caption": caption,
               "controls": list(control_digests), "bucket": list(bucket),
               "resample": "lanczos", "model": model_identity, "space": space_version}
    if any(flips):  # absent when unflipped: existing entries stay valid
        payload["flip"] = list(flips)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# (captions, items, control tensors) -> the batch's embeds (data.batches.BatchSource)
ControlEmbeds = Callable[[list[str], Sequence[Item], list[torch.Tensor]], AdvancedPromptEmbeds]
EmbedWithControls = Callable[[list[str], list[torch.Tensor]], AdvancedPromptEmbeds]


class ControlTextEmbedCache:
    """Text embeddings per (caption, control files' content, bucket): memory always,
    disk when `folder` is set (one AdvancedPromptEmbeds file per entry)."""

    def __init__(self, encode: EmbedWithControls, model_identity: str, space_version: str,
                 folder: Path | None, report: Callable[[str], None] = print) -> None:
        self.encode = encode
        self.identity = model_identity
        self.space = space_version
        self.folder = folder
        self.report = report
        self._digests: dict[Path, str] = {}
        self._memory: dict[str, AdvancedPromptEmbeds] = {}
        self.computed = 0

    def key(self, caption: str, item: Item) -> str:
        digests = []
        for path in item.controls:
            if path not in self._digests:
                self._digests[path] = sha256_file(path)
            digests.append(self._digests[path])
        return control_text_key(caption, digests, item.bucket, self.identity, self.space,
                                item.flips)

    def fill(self, pairs: Iterable[tuple[str, Item]],
             stop: Callable[[], None] = lambda: None) -> None:
        for caption, item in dict.fromkeys(pairs):
            stop()
            key = self.key(caption, item)
            if key in self._memory:
                continue
            loaded = self._load(key)
            if loaded is None:
                controls = [t[None] for t in (load_control(p, item.bucket)
                                              for p in item.controls)]
                with torch.no_grad():
                    loaded = self.encode([caption], controls).detach().to("cpu")
                self.computed += 1
                if self.folder is not None:
                    loaded.save(self._path(key))
            self._memory[key] = loaded

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.safetensors"

    def _load(self, key: str) -> AdvancedPromptEmbeds | None:
        if self.folder is None or not self._path(key).exists():
            return None
        try:
            return AdvancedPromptEmbeds.load(self._path(key))
        except PromptEmbedsFileError as exc:
            self.report(f"text-embedding cache entry {key[:12]} is unreadable ({exc}); "
                        "recomputing")
            return None

    def get(self, captions: Sequence[str], items: Sequence[Item]) -> AdvancedPromptEmbeds:
        return AdvancedPromptEmbeds.cat([self._memory[self.key(c, i)]
                                         for c, i in zip(captions, items, strict=True)])


def caption_pairs(items: Sequence[Item]) -> list[tuple[str, Item]]:
    """Every (caption, item) a run can draw: the empty caption too where dropout is on."""
    pairs = [(i.caption, i) for i in items]
    pairs += [("", i) for i in items if i.caption_dropout_rate > 0]
    return pairs
