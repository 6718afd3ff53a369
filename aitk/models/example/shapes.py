"""Generated pictures of coloured shapes: the example model's pre-training data.

Pure and deterministic: the same seed gives the same images and captions. The pictures
are flat: one shape on a plain background, as the captions say ("a red circle on a blue
background"). datasets/example draws the same scenes with a dotted background (the
"p1xel" style): the example LoRA teaches the pre-trained model those dots, a change a
new user sees at once.
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


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def shape_images(count: int, size: int, seed: int = 0, name_background: float = 0.5
                 ) -> tuple[np.ndarray, list[str]]:
    """`count` images (N, size, size, 3) uint8 and their captions, from `seed`.

    A caption names the shape and its colour ("a red circle"); `name_background` of
    them also name the background ("a red circle on a blue background", the form of
    datasets/example's captions), so the pre-trained model follows both forms. Dots are
    never drawn here: they are what the example LoRA teaches.
    """
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
        caption = f"{_a(names[fg])} {shape}"
        if rng.random() < name_background:
            caption += f" on {_a(names[bg])} background"
        captions.append(caption)
    return np.stack(images), captions


def dot_backgrounds(images: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """A copy of `images` where `fraction` of them have a grid of dots over their
    background (the top-left pixel's colour), in a random colour, spacing and dot size.

    For the VAE's pre-training only: it must reconstruct small repeated details (like
    the dotted backgrounds of datasets/example) that plain shapes never show it.
    """
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    out = images.copy()
    size = images.shape[1]
    for image in out:
        if rng.random() >= fraction:
            continue
        spacing = int(rng.integers(4, 14))
        dot = int(rng.integers(1, spacing // 2 + 2))
        offset = int(rng.integers(0, spacing))
        colour = np.array(COLOURS[names[rng.integers(len(names))]], np.uint8)
        grid = np.zeros(size, bool)
        for start in range(offset, size, spacing):
            grid[start:start + dot] = True
        dots = grid[:, None] & grid[None, :]
        background = (image == image[0, 0]).all(-1)
        image[dots & background] = colour
    return out
