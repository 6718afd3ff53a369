"""The picture the model looks at: an image (EXIF-upright RGB), or a video's first
frame. Read with the dataset's own bounded readers (aitk.data.dataset, aitk.data.video),
so a caption run refuses what training would (FIFOs, decompression bombs, endless
files), and shrunk to at most MAX_PIXELS: Qwen-VL turns every 28x28 patch into a token,
and a 12-megapixel photo would be 16,000 of them for a sentence of text.
"""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageOps

MAX_PIXELS = 1024 * 1024


def shrunk(image: Image.Image, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """`image` scaled down (aspect kept) to at most `max_pixels`; as it is when smaller."""
    w, h = image.size
    if w * h <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (w * h))
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def load_picture(path: Path) -> Image.Image:
    """RGB pixels of an image, or of a video's first frame. Raises BadInputFile,
    UnreadableVideo, or PIL's errors for a file that cannot be read."""
    from aitk.data.dataset import MAX_IMAGE_PIXELS, open_image, open_input
    from aitk.data.video import MAX_VIDEO_BYTES, is_video, read_frames

    if is_video(path):
        with open_input(path, MAX_VIDEO_BYTES) as fh:
            frame = next(read_frames(fh, [0], MAX_IMAGE_PIXELS))
        return shrunk(frame.convert("RGB"))
    with open_image(path) as img:
        img.load()
        return shrunk(ImageOps.exif_transpose(img).convert("RGB"))
