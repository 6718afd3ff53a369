"""Generated pictures of coloured shapes: the example model's pre-training data.

Pure and deterministic: the same seed gives the same images and captions. Captions name
only the shape ("a circle"), never a colour, so the pre-trained model draws circles and
squares in arbitrary colours; a LoRA trained on `datasets/example` (captions that name
the colours, a dotted background) then visibly teaches it something new.
"""

from __future__ import annotations

import numpy as np

# The CSS colours of those names (the ones datasets/example draws with).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0), "green": (0, 128, 0), "blue": (0, 0, 255),
    "yellow": (255, 255, 0), "purple": (128, 0, 128), "orange": (255, 165, 0),
    "white": (255, 255, 255), "black": (0, 0, 0), "gray": (128, 128, 128),
    "cyan": (0, 255, 255), "pink": (255, 192, 203), "brown": (165, 42, 42),
}
SHAPES = ("circle", "square")


def draw_shape(size: int, shape: str, centre: tuple[float, float], radius: float,
               fg: tuple[int, int, int], bg: tuple[int, int, int]) -> np.ndarray:
    """(size, size, 3) uint8: one filled shape on a plain background."""
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    dy, dx = ys - centre[0], xs - centre[1]
    inside = (dy ** 2 + dx ** 2 <= radius ** 2) if shape == "circle" else (
        (np.abs(dy) <= radius) & (np.abs(dx) <= radius))
    return np.where(inside[..., None], np.array(fg, np.uint8), np.array(bg, np.uint8))


def shape_images(count: int, size: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """`count` images (N, size, size, 3) uint8 and their captions, from `seed`."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    images, captions = [], []
    for _ in range(count):
        shape = SHAPES[rng.integers(len(SHAPES))]
        fg, bg = rng.choice(len(names), size=2, replace=False)
        radius = size * rng.uniform(0.18, 0.32)
        centre = tuple(size * rng.uniform(0.35, 0.65, size=2))
        images.append(draw_shape(size, shape, centre, radius, COLOURS[names[fg]],
                                 COLOURS[names[bg]]))
        captions.append(f"a {shape}")
    return np.stack(images), captions
