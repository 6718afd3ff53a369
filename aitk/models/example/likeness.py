"""How close previews are to the training images: the example's "did it learn?" measure.

Each preview is compared with the training image whose caption is the preview's prompt
(the trigger word and "style" aside): both are centre-cropped to a square, resized to
the preview's size, and the distance is their mean absolute pixel difference (0 = the
same picture, 1 = black against white). Comparing with the *nearest* training image
instead rewards a flat average colour (a plain grey preview is near the grey-background
image whatever was asked), so a model that learned nothing could score well.

Pure numpy + Pillow, so a test, a bench script and a person's check all compute the
same number.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def square(image: Image.Image, size: int) -> np.ndarray:
    """(size, size, 3) float32 in [0, 1]: the centre square, resized."""
    rgb = image.convert("RGB")
    w, h = rgb.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    crop = rgb.crop((left, top, left + side, top + side))
    return np.asarray(crop.resize((size, size), Image.Resampling.BICUBIC),
                      np.float32) / 255.0


def caption_key(text: str, trigger: str = "") -> str:
    """The words of a caption or prompt that say what is drawn, lower-case."""
    words = re.findall(r"[a-z0-9]+", text.lower().replace("[trigger]", " "))
    drop = {"style", trigger.lower()}
    return " ".join(w for w in words if w not in drop)


def captioned_images(folder: Path, caption_ext: str = "txt", trigger: str = ""
                     ) -> dict[str, Path]:
    """caption_key -> image path for each image of `folder` with a caption file."""
    out: dict[str, Path] = {}
    for path in sorted(Path(folder).iterdir()):
        caption = path.with_suffix(f".{caption_ext}")
        if path.suffix.lower() in IMAGE_SUFFIXES and caption.is_file():
            out[caption_key(caption.read_text(encoding="utf-8"), trigger)] = path
    return out


def distance(preview: Path, reference: Path) -> float:
    """Mean absolute pixel difference of two pictures at the preview's size."""
    with Image.open(preview) as image:
        size = min(image.size)
        pixels = square(image, size)
    with Image.open(reference) as image:
        target = square(image, size)
    return float(np.abs(pixels - target).mean())


def mean_distance(previews: Iterable[tuple[Path, str]], folder: Path,
                  trigger: str = "") -> float:
    """Mean distance of (preview, its prompt) pairs to the training images of `folder`
    captioned with those prompts. A prompt no training image has is a ValueError."""
    references = captioned_images(folder, trigger=trigger)
    pairs = list(previews)
    if not pairs:
        raise ValueError("no previews to measure")
    total = 0.0
    for preview, prompt in pairs:
        key = caption_key(prompt, trigger)
        if key not in references:
            raise ValueError(f"no training image in {folder} is captioned {prompt!r}")
        total += distance(preview, references[key])
    return total / len(pairs)
