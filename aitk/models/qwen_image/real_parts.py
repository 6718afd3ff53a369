"""The real, full-size configs of Qwen-Image's parts (the shapes only: no weights), keyed
by (hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aitk.models.real_parts import RealPart

if TYPE_CHECKING:
    from torch import nn


# Qwen2.5-VL-7B-Instruct, Qwen-Image's text encoder: kohya-ss/musubi-tuner's
# QWEN2_5_VL_CONFIG_JSON (the Qwen-Image text_encoder/config.json).
QWEN25_VL_7B = RealPart("transformers", "Qwen2_5_VLForConditionalGeneration", {
    "text_config": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                    "num_hidden_layers": 28, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "max_position_embeddings": 128000,
                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_channels": 3, "out_hidden_size": 3584,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                      "hidden_act": "silu"},
    "tie_word_embeddings": False}, "Qwen/Qwen2.5-VL-7B-Instruct (Qwen-Image text_encoder)")

# Qwen-Image's transformer and VAE: diffusers' class defaults are the released config
# (QwenImageTransformer2DModel / AutoencoderKLQwenImage, diffusers 0.42).
QWEN_IMAGE_TRANSFORMER = RealPart("diffusers", "QwenImageTransformer2DModel", {
    "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60,
    "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584,
    "guidance_embeds": False, "axes_dims_rope": [16, 56, 56]},
    "Qwen/Qwen-Image transformer/config.json (= diffusers' defaults)")
QWEN_IMAGE_VAE = RealPart("diffusers", "AutoencoderKLQwenImage", {
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True]},
    "Qwen/Qwen-Image vae/config.json (= diffusers' defaults)")
QWEN_IMAGE = {"transformer": QWEN_IMAGE_TRANSFORMER, "text_encoder": QWEN25_VL_7B,
              "vae": QWEN_IMAGE_VAE}


def _drop_vision_tower(module: nn.Module) -> None:
    from aitk.models.qwen_image.model import drop_vision_tower

    drop_vision_tower(module)


# subfolder -> what the arch's loader does to the part after loading it.
KEPT: dict[str, Callable[[nn.Module], None]] = {"text_encoder": _drop_vision_tower}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("Qwen/Qwen-Image", k): v for k, v in QWEN_IMAGE.items()},
}
