"""Image augmentation (upstream's dataset keys), on PIL so the trainer needs no
torchvision.

- `flip_x` / `flip_y`: as upstream, the dataset is extended with a mirrored copy of
  every image (left-right, top-bottom; both: four copies), not flipped at random, so
  each epoch sees both; the copies' latents are cached like any other
  (aitk.data.dataset.load_pixels flips before the bucket's resize and crop).
- `augments`: names of random transforms applied every time an item is drawn (upstream
  applies torchvision's, with these settings, after the resize and crop):

      ColorJitter      brightness, contrast and saturation each by a factor in
                       [0.8, 1.2], hue shifted by up to 0.03 of a turn, in random order
      RandomEqualize   histogram equalisation, with probability 0.2

  PIL's ImageEnhance and ImageOps are what torchvision itself calls for PIL images.
  Draws come from the caller's generator (keyed by seed, epoch, batch and position),
  so a resumed run augments exactly as an uninterrupted one. A random transform makes
  the pixels differ at every draw, so a dataset with augments is encoded per batch,
  never from the latent cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from aitk.config import choices

JITTER = 0.2  # brightness, contrast, saturation: factor in [1 - JITTER, 1 + JITTER]
HUE = 0.03  # of a full turn
EQUALIZE_P = 0.2


def _hue(img: Image.Image, shift: float) -> Image.Image:
    h, s, v = img.convert("HSV").split()
    rotated = (np.asarray(h, dtype=np.uint8).astype(np.int16) + round(shift * 255)) % 256
    hsv = Image.merge("HSV", (Image.fromarray(rotated.astype(np.uint8), "L"), s, v))
    return hsv.convert("RGB")


def color_jitter(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    steps: list[Callable[[Image.Image], Image.Image]] = []
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        factor = float(rng.uniform(1 - JITTER, 1 + JITTER))
        steps.append(lambda im, e=enhance, f=factor: e(im).enhance(f))
    shift = float(rng.uniform(-HUE, HUE))
    steps.append(lambda im: _hue(im, shift))
    for index in rng.permutation(len(steps)):
        img = steps[int(index)](img)
    return img


def random_equalize(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    return ImageOps.equalize(img) if rng.random() < EQUALIZE_P else img


AUGMENTS: dict[str, Callable[[Image.Image, np.random.Generator], Image.Image]] = {
    "ColorJitter": color_jitter, "RandomEqualize": random_equalize}
assert tuple(AUGMENTS) == choices.AUGMENTS  # the schema's list (torch- and PIL-free)


def augment(img: Image.Image, names: Sequence[str], rng: np.random.Generator
            ) -> Image.Image:
    """`img` (RGB) through each named transform, in the order given."""
    for name in names:
        img = AUGMENTS[name](img.convert("RGB"), rng)
    return img


def flip(img: Image.Image, flip_x: bool, flip_y: bool) -> Image.Image:
    if flip_x:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if flip_y:
        img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return img
