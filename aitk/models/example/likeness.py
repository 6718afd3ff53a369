"""How close previews are to the training images: the example's "did it learn?" measure.

Each training image is centre-cropped to a square and resized to the preview's size;
a preview's distance is the mean absolute pixel difference (0 = the same picture,
1 = black against white) to the nearest of them. Pure numpy + Pillow, so a test, a
bench script and a person's check all compute the same number.
"""

from __future__ import annotations

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


def training_images(folder: Path, size: int) -> list[np.ndarray]:
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    out = []
    for path in paths:
        with Image.open(path) as image:
            out.append(square(image, size))
    return out


def distance(preview: Path, references: list[np.ndarray]) -> float:
    """Mean absolute difference from `preview` to the nearest reference image."""
    with Image.open(preview) as image:
        pixels = square(image, references[0].shape[0])
    return min(float(np.abs(pixels - ref).mean()) for ref in references)


def mean_distance(previews: Iterable[Path], folder: Path) -> float:
    previews = list(previews)
    if not previews:
        raise ValueError("no previews to measure")
    with Image.open(previews[0]) as first:
        size = min(first.size)
    references = training_images(folder, size)
    return float(np.mean([distance(p, references) for p in previews]))
