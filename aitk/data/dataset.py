"""Image folders with same-name caption files -> training items.

Caption rules (upstream's): the dataset's `replacements` ("from|to") are applied to
the caption text first (replace_text); then `[trigger]` in a caption becomes the
trigger word, and the trigger word is prepended when the caption does not contain it;
a missing caption file uses `default_caption` (empty when unset). Unreadable images
are skipped. Both are reported once each through `report`, and neither stops the job;
a dataset with no usable image is an error.

Videos (mp4, webm, mov, mkv) are read when the dataset's `num_frames` is above 1 (a
video arch; aitk.data.video picks and decodes the frames): each becomes a clip of
`num_frames` frames, pixels (3, F, H, W), bucketed by its frame size. For a video arch
an image is a 1-frame clip (3, 1, H, W). A video that cannot be decoded, or has fewer
frames than `num_frames`, is reported once and skipped like an unreadable image; with
`num_frames: 1` the folder's videos are skipped (one report for the folder).

Every input file is read bounded and without blocking (`open_input`): only regular
files are read (a FIFO, device or folder named `x.png` is refused, never waited on),
captions up to MAX_CAPTION_BYTES, images up to MAX_IMAGE_BYTES on disk and
MAX_IMAGE_PIXELS decoded, videos up to MAX_VIDEO_BYTES on disk, MAX_IMAGE_PIXELS a frame
and MAX_VIDEO_FRAMES frames. Symlinks are followed (datasets are often assembled from
links), but only to a regular file: a link to /dev/zero is refused like the device.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from aitk.data.audio import AudioSpan, clip_span
from aitk.data.augment import flip
from aitk.data.buckets import ResizeCrop, Size, bucket_for, resize_crop
from aitk.data.folders import folder_entries
from aitk.data.formats import IMAGE_EXTENSIONS, TRIGGER_TAG, VIDEO_EXTENSIONS
from aitk.data.video import (
    MAX_VIDEO_BYTES,
    ClipSpec,
    fits_at_fps,
    frame_indices,
    is_video,
    probe,
    read_frames,
)
from aitk.errors import BadInputFile, DatasetError, UnreadableVideo

MAX_CAPTION_BYTES = 64 * 1024
MAX_IMAGE_BYTES = 512 * 2**20
MAX_IMAGE_PIXELS = 2**26  # 8192 x 8192; a bigger image would take GBs to decode


def open_input(path: Path, limit: int) -> BinaryIO:
    """`path` opened for reading when it is (or links to) a regular file of at most
    `limit` bytes. O_NONBLOCK: opening a FIFO returns at once instead of waiting for a
    writer (and it is then refused); it changes nothing for a regular file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInputFile(f"not a regular file: {path}")
        if info.st_size > limit:
            raise BadInputFile(f"{info.st_size} bytes, more than the {limit}-byte limit")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class Item:
    path: Path
    caption: str  # after trigger rules; dropout happens per draw
    size: Size  # the source image, after EXIF orientation
    bucket: Size  # the size it trains at
    caption_dropout_rate: float = 0.0
    # None: an image for an image arch, pixels (3, H, W). Otherwise a clip for a video
    # arch, pixels (3, F, H, W): the video's frame indices chosen at scan, (0,) for an image.
    frames: tuple[int, ...] | None = None
    controls: tuple[Path, ...] = ()  # edit models: paired control images (data.controls)
    # flip_x / flip_y datasets add mirrored copies (aitk.data.augment)
    flip_x: bool = False
    flip_y: bool = False
    dataset: int = 0  # its index in the process's `datasets` (per-dataset settings)
    # A video of a `do_audio` dataset for an arch that trains sound: the soundtrack's
    # source span (aitk.data.audio); None: no sound is read for it.
    audio: AudioSpan | None = None

    @property
    def group(self) -> tuple[int, int, int, int]:
        """Items batch together when their dataset, bucket and frame count agree (as
        upstream, a batch never mixes datasets: each has its own batch size)."""
        return (self.dataset, *self.bucket,
                len(self.frames) if self.frames is not None else 0)

    @property
    def flips(self) -> tuple[bool, bool]:
        return self.flip_x, self.flip_y


def apply_trigger(caption: str, trigger: str | None, add_if_missing: bool = True) -> str:
    """`[trigger]` -> trigger; prepend the trigger when the caption lacks it (not for a
    regularization dataset's captions, `add_if_missing=False`, as upstream)."""
    if not trigger:
        cleaned = caption.replace(TRIGGER_TAG, "")
        return re.sub(r"\s*,\s*(,\s*)+", ", ", cleaned).strip(" ,")
    caption = caption.replace(TRIGGER_TAG, trigger)
    if trigger not in caption and add_if_missing:
        caption = f"{trigger}, {caption}" if caption.strip() else trigger
    return caption.strip()


Replacement = tuple[str, str]  # (from, to): a dataset's `replacements` entry "from|to"


def replace_text(caption: str, replacements: Sequence[Replacement]) -> str:
    """Upstream's `replacements`: every occurrence of each `from`, in the order given,
    becomes its `to` (plain text, case-sensitive), before the trigger rules."""
    for old, new in replacements:
        caption = caption.replace(old, new)
    return caption


def read_caption(image: Path, caption_ext: str, default_caption: str | None,
                 report: Callable[[str], None]) -> str:
    ext = caption_ext if caption_ext.startswith(".") else f".{caption_ext}"
    caption_file = image.with_suffix(ext)
    try:
        with open_input(caption_file, MAX_CAPTION_BYTES) as fh:
            return fh.read(MAX_CAPTION_BYTES + 1).decode("utf-8").strip()
    except FileNotFoundError:
        report(f"{image}: no caption file {caption_file.name}; using "
               + (f"the default caption {default_caption!r}" if default_caption
                  else "an empty caption"))
    except (OSError, UnicodeDecodeError) as exc:
        report(f"{caption_file}: unreadable caption ({exc}); using the default caption")
    return default_caption or ""


@contextmanager
def open_image(path: Path) -> Iterator[Image.Image]:
    """PIL's image for a regular file within the byte and pixel limits (header read,
    nothing decoded yet). Raises BadInputFile or PIL's errors."""
    with open_input(path, MAX_IMAGE_BYTES) as fh:
        with warnings.catch_warnings():  # our own pixel limit below, stricter than PIL's
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(fh)
        with img:
            w, h = img.size
            if w * h > MAX_IMAGE_PIXELS:
                raise BadInputFile(f"{w}x{h} pixels, more than the {MAX_IMAGE_PIXELS}-pixel "
                                   "limit")
            yield img


def image_size(path: Path) -> Size:
    """(width, height) after EXIF rotation; raises on anything PIL cannot read.

    The pixels are decoded, not only the header: a truncated file has a valid header
    and would otherwise fail later, mid-run, when its latents are computed.
    """
    with open_image(path) as img:
        img.verify()
    with open_image(path) as img:
        img.load()
        w, h = img.size
        orientation = img.getexif().get(0x0112, 1)
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def video_clip(path: Path, clip: ClipSpec, report: Callable[[str], None]
               ) -> tuple[Size, tuple[int, ...], AudioSpan | None]:
    """(frame size, frame indices, soundtrack span when `clip.audio`) of a video;
    UnreadableVideo or BadInputFile."""
    with open_input(path, MAX_VIDEO_BYTES) as fh:
        info = probe(fh, MAX_IMAGE_PIXELS)
    frames = frame_indices(info, clip)
    if not clip.auto and not clip.shrink and not fits_at_fps(info, clip):
        report(f"{path}: {info.frames} frames are too few for {clip.num_frames} at "
               f"{clip.fps:g} fps; spread over the whole clip instead")
    span = None
    if clip.audio:
        span = clip_span(frames, info.fps, clip.fps, clip.auto and clip.trim_tail,
                         clip.audio_normalize, clip.audio_preserve_pitch)
        if span is None:
            report(f"{path}: the video does not say its frame rate; trains without sound")
    return (info.width, info.height), frames, span


def scan_folder(folder: Path, *, caption_ext: str = "txt", default_caption: str | None = None,
                trigger_word: str | None = None, resolutions: Sequence[int] = (512,),
                divisibility: int = 16, caption_dropout_rate: float = 0.0,
                num_repeats: int = 1, clip: ClipSpec | None = None,
                report: Callable[[str], None] = print, add_trigger: bool = True,
                replacements: Sequence[Replacement] = (), scale: float = 1.0,
                square_crop: bool = False) -> list[Item]:
    """Every usable (image or video, resolution) pair, repeated `num_repeats` times.
    `clip`: the frame settings of a video arch (None for an image arch); `scale` and
    `square_crop`: the dataset's keys (aitk.data.buckets.bucket_for)."""
    if not folder.is_dir():
        raise DatasetError(f"dataset folder {folder} does not exist")
    takes_videos = clip is not None and (clip.num_frames > 1 or clip.auto)
    kinds = IMAGE_EXTENSIONS + (VIDEO_EXTENSIONS if takes_videos else ())
    entries = folder_entries(folder)
    videos = sum(1 for p in entries if p.suffix.lower() in VIDEO_EXTENSIONS)
    if videos and not takes_videos:
        report(f"{folder}: {videos} video file{'s' * (videos > 1)} skipped (num_frames is 1: "
               "images only; a video arch with num_frames 4k+1 trains on videos)")
    items: list[Item] = []
    for path in (p for p in entries if p.suffix.lower() in kinds):
        frames: tuple[int, ...] | None = None if clip is None else (0,)
        span: AudioSpan | None = None
        try:
            if is_video(path):
                assert clip is not None
                size, frames, span = video_clip(path, clip, report)
            else:
                size = image_size(path)
        except BadInputFile as exc:
            report(f"{path}: skipped ({exc})")
            continue
        except UnreadableVideo as exc:
            report(f"{path}: unusable video, skipped ({exc})")
            continue
        except (OSError, UnidentifiedImageError, SyntaxError, ValueError,
                Image.DecompressionBombError) as exc:
            report(f"{path}: unreadable image, skipped ({exc.__class__.__name__})")
            continue
        caption = apply_trigger(replace_text(read_caption(path, caption_ext, default_caption,
                                                          report), replacements),
                                trigger_word, add_trigger)
        for res in resolutions:
            bucket = bucket_for(*size, res, divisibility, scale, square_crop)
            if bucket is None:
                report(f"{path}: {size[0]}x{size[1]}"
                       + (f" at scale {scale:g}" if scale != 1.0 else "")
                       + f" is smaller than one {divisibility}px cell; skipped")
                break
            items += [Item(path, caption, size, bucket, caption_dropout_rate,
                           frames, audio=span)] * num_repeats
    if not items:
        what = "images or videos" if takes_videos else "images"
        raise DatasetError(f"dataset folder {folder} has no usable {what} "
                           f"({', '.join(kinds)})")
    return items


Augment = Callable[[Image.Image], Image.Image]


def to_bucket(img: Image.Image, bucket: Size, flips: tuple[bool, bool] = (False, False),
              augment: Augment | None = None, plan: ResizeCrop | None = None
              ) -> torch.Tensor:
    """(3, H, W) float32 in [-1, 1] at `bucket`: flipped (as upstream, before the
    resize), resized down (Lanczos), cropped (`plan`, a random_crop draw; None: the
    centre), then `augment`ed."""
    img = flip(img.convert("RGB"), *flips)
    plan = plan or resize_crop(img.width, img.height, bucket)
    if (plan.resize_w, plan.resize_h) != img.size:
        img = img.resize((plan.resize_w, plan.resize_h), Image.Resampling.LANCZOS)
    img = img.crop((plan.left, plan.top, plan.left + plan.width, plan.top + plan.height))
    if augment is not None:
        img = augment(img)
    arr = np.asarray(img, dtype=np.float32)
    return torch.from_numpy(arr).permute(2, 0, 1) / 127.5 - 1.0


def load_pixels(item: Item, augment: Augment | None = None, plan: ResizeCrop | None = None
                ) -> torch.Tensor:
    """The item at its bucket, in [-1, 1]: (3, H, W) for an image arch, (3, F, H, W) for
    a video arch (a video's chosen frames, all cropped by the one `plan`; an image as
    one frame)."""
    if is_video(item.path):
        assert item.frames is not None
        with open_input(item.path, MAX_VIDEO_BYTES) as fh:
            frames = [to_bucket(f, item.bucket, item.flips, plan=plan)
                      for f in read_frames(fh, item.frames, MAX_IMAGE_PIXELS)]
        return torch.stack(frames, dim=1)
    with open_image(item.path) as img:
        pixels = to_bucket(ImageOps.exif_transpose(img), item.bucket, item.flips, augment,
                           plan)
    return pixels if item.frames is None else pixels.unsqueeze(1)


def load_audio(item: Item, sample_rate: int, channels: int) -> np.ndarray | None:
    """The item's soundtrack (aitk.data.audio.read_audio), read bounded like its frames;
    None when it has no span or the file has no audio stream."""
    if item.audio is None:
        return None
    from aitk.data.audio import read_audio

    with open_input(item.path, MAX_VIDEO_BYTES) as fh:
        return read_audio(fh, item.audio, sample_rate, channels)


def dropped_captions(seed: int, epoch: int, batch_index: int,
                     rates: Sequence[float], stream: int = 0) -> list[bool]:
    """Caption dropout for one batch, from (seed, epoch, batch) alone -- resumable.
    `stream` 1 is the regularization datasets' batch order (aitk.data.batches)."""
    if not any(rates):
        return [False] * len(rates)
    key = [seed, epoch, batch_index, 7] + ([stream] if stream else [])
    draws = np.random.default_rng(key).random(len(rates))
    return [bool(d < r) for d, r in zip(draws, rates, strict=True)]
