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


def _framed_example():
    """A video arch for the end-to-end job test: the example arch run frame by frame
    (frames folded into the batch), so clips train, cache and preview like Wan's."""
    from aitk.models.example.model import ExampleModel

    class FramedExample(ExampleModel):
        arch = "framed_example"
        is_video = True

        def encode_images(self, images: torch.Tensor) -> torch.Tensor:
            if images.ndim == 4:
                images = images.unsqueeze(2)
            b, c, f, h, w = images.shape
            flat = images.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
            latents = super().encode_images(flat)
            return latents.reshape(b, f, *latents.shape[1:]).permute(0, 2, 1, 3, 4)

        def get_noise_prediction(self, latent_model_input, timestep, text_embeddings,
                                 batch=None, **kwargs):
            if latent_model_input.ndim == 4:  # the preview sampler: one frame
                return super().get_noise_prediction(latent_model_input, timestep,
                                                    text_embeddings, batch, **kwargs)
            b, c, f, h, w = latent_model_input.shape
            flat = latent_model_input.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
            t = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1).expand(b)
            embeds = text_embeddings.expand_to_batch(b).select(
                [i for i in range(b) for _ in range(f)])
            pred = super().get_noise_prediction(flat, t.repeat_interleave(f), embeds)
            return pred.reshape(b, f, c, h, w).permute(0, 2, 1, 3, 4)

        def generate_single_image(self, pipeline, gen_config, conditional_embeds,
                                  unconditional_embeds, generator):
            image = super().generate_single_image(pipeline, gen_config, conditional_embeds,
                                                  unconditional_embeds, generator)
            return [image.rotate(90 * i) for i in range(gen_config.num_frames)]

    return FramedExample


FramedExample = _framed_example()
