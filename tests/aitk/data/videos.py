"""Test videos written through PyAV's real encoders, and a tiny video arch.

Frame i of a written video is flat grey STEP * i, so the frames a decoder returns name
themselves: `frame_numbers` reads them back (lossy codecs keep a flat frame within a
few levels, far below STEP / 2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from aitk.models.base import GenerateImageConfig
from tests.aitk.aitk_testing import TinyModel

STEP = 14  # grey levels between frames: up to 18 frames fit in 0..255
CODECS = {".mp4": "libx264", ".webm": "libvpx-vp9", ".mkv": "libx264", ".mov": "libx264"}


def write_video(path: Path, frames: int, size: tuple[int, int] = (32, 32), fps: int = 24,
                caption: str | None = None) -> Path:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream(CODECS[path.suffix], rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            arr = np.full((height, width, 3), STEP * i, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)
    return path


def frame_numbers(pixels: torch.Tensor) -> list[int]:
    """(3, F, H, W) in [-1, 1] -> the index each frame was written with."""
    grey = ((pixels + 1) * 127.5).mean(dim=(0, 2, 3))
    return [round(float(g) / STEP) for g in grey]


class VideoModel(TinyModel):
    """A video arch for the data tests: latents are 2x2 pixel means of every frame."""

    arch = "tiny_video"
    is_video = True

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        self.encode_calls += 1
        if images.ndim == 4:  # an image: a 1-frame clip
            images = images.unsqueeze(2)
        return torch.nn.functional.avg_pool3d(images, (1, 2, 2))

    def generate_single_image(self, pipeline, gen_config: GenerateImageConfig,
                              conditional_embeds, unconditional_embeds, generator):
        size = (gen_config.width, gen_config.height)
        return [Image.new("RGB", size, (STEP * i, 0, 0)) for i in range(gen_config.num_frames)]
