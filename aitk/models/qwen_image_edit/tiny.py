"""A tiny random-initialised Qwen-Image-Edit model folder, built locally (no download).

qwen_image's tiny builder (aitk.models.qwen_image.tiny: byte-level tokenizer, 1-layer
Qwen2.5-VL text model, tiny VAE and transformer) with what the edit archs add: the
vision tokens in the tokenizer and the text encoder's config, a 1-block vision tower
(built by qwen_image's config already), `model_index.json` naming the edit pipeline,
and `processor/preprocessor_config.json` for the PIL image processor with a small pixel
budget (at most 112 x 112, 16 vision tokens per image), so tests stay fast.
"""

from __future__ import annotations

from pathlib import Path

from aitk.models.qwen_image.tiny import build_tiny_qwen_image
from aitk.models.qwen_image_edit.vision import VISION_TOKENS

TINY_MAX_PIXELS = 112 * 112


def write_processor(folder: Path) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=TINY_MAX_PIXELS
                             ).save_pretrained(folder / "processor")


def build_tiny_qwen_image_edit(target: Path, seed: int = 0,
                               pipeline: str = "QwenImageEditPipeline") -> Path:
    return build_tiny_qwen_image(target, seed=seed, pipeline=pipeline,
                                 vision_tokens=VISION_TOKENS, extra=write_processor)
