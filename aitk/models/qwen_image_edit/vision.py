"""Images into Qwen2.5-VL's text encoder without torchvision.

transformers' `Qwen2VLProcessor` cannot be built here: its video processor (and the
default "fast" image processor) import torchvision, which has no CPU build for our torch.
The trainer does not need either: `VisionTextInputs` does the processor's two jobs with
pieces that need only PIL and numpy:

- pixels: transformers' own PIL-backend image processor, `Qwen2VLImageProcessorPil`
  (smart resize to multiples of patch * merge within min/max pixels, rescale, CLIP
  normalisation, patchify) gives `pixel_values` and `image_grid_thw`, read from the model
  folder's `processor/preprocessor_config.json` when it has one;
- text: each `<|image_pad|>` in a prompt is expanded to grid_t * grid_h * grid_w /
  merge_size**2 copies (the number of merged vision tokens the encoder inserts there),
  then the tokenizer runs.

It is called like `Qwen2VLProcessor` (`text=`, `images=`, `padding=`, `return_tensors=`),
so diffusers' edit pipelines accept it as their `processor` (the interop tests do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

IMAGE_PAD = "<|image_pad|>"
VISION_TOKENS = ("<|vision_start|>", IMAGE_PAD, "<|vision_end|>")


def calculate_dimensions(target_area: int, ratio: float) -> tuple[int, int]:
    """(width, height) of about `target_area` pixels at `ratio` = width / height, both
    multiples of 32 (diffusers' Qwen-Image-Edit pipelines size their images this way)."""
    width = math.sqrt(target_area * ratio)
    height = width / ratio
    return round(width / 32) * 32, round(height / 32) * 32


def to_pil(pixels: torch.Tensor) -> Image.Image:
    """(3, H, W) in [0, 1] -> an RGB image (exact for pixels that came from 8-bit files)."""
    arr = (pixels.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return Image.fromarray(arr.permute(1, 2, 0).cpu().numpy())


def resized(image: Image.Image, target_area: int) -> Image.Image:
    """`image` at about `target_area` pixels, its aspect kept (LANCZOS, as diffusers'
    VaeImageProcessor.resize does for the pipelines' condition images)."""
    width, height = calculate_dimensions(target_area, image.width / image.height)
    if (width, height) == image.size:
        return image
    return image.resize((width, height), Image.Resampling.LANCZOS)


class VisionTextInputs:
    """Qwen2VLProcessor's call for images + text, without torchvision (module docstring)."""

    def __init__(self, tokenizer: Any, image_processor: Any = None) -> None:
        if image_processor is None:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                Qwen2VLImageProcessorPil,
            )

            image_processor = Qwen2VLImageProcessorPil()
        self.tokenizer = tokenizer
        self.image_processor = image_processor

    def __call__(self, text: str | Sequence[str], images: Any = None, padding: bool = True,
                 return_tensors: str = "pt", **kwargs: Any) -> Any:
        from transformers import BatchFeature

        texts = [text] if isinstance(text, str) else list(text)
        data: dict[str, Any] = {}
        if images is not None:
            images = images if isinstance(images, list | tuple) else [images]
            pix = self.image_processor(images=list(images), return_tensors="pt")
            data = {"pixel_values": pix["pixel_values"],
                    "image_grid_thw": pix["image_grid_thw"]}
            texts = self._expand(texts, pix["image_grid_thw"])
        tokens = self.tokenizer(texts, padding=padding, return_tensors=return_tensors)
        return BatchFeature(data={**tokens, **data})

    def _expand(self, texts: list[str], grids: torch.Tensor) -> list[str]:
        merge = int(self.image_processor.merge_size) ** 2
        counts = iter(int(np.prod(g.tolist())) // merge for g in grids)
        marker = "\0image\0"
        out = []
        for t in texts:
            parts = t.split(IMAGE_PAD)
            try:
                pads = [marker * next(counts) for _ in parts[1:]]
            except StopIteration:
                raise ValueError("more image placeholders than images") from None
            out.append("".join(p + pad for p, pad in zip(parts, [*pads, ""], strict=True))
                       .replace(marker, IMAGE_PAD))
        if next(counts, None) is not None:
            raise ValueError("more images than image placeholders")
        return out
