"""The real, full-size configs of Krea 2's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aitk.models.qwen_image.real_parts import QWEN_IMAGE_VAE
from aitk.models.real_parts import RealPart

if TYPE_CHECKING:
    from torch import nn


# Krea 2: the transformer is upstream ai-toolkit's KREA2_MMDIT_CONFIG
# (extensions_built_in/diffusion_models/krea2/krea2.py: features 6144 = 48 heads x 128,
# 12 kv heads, 28 layers, txtdim 2560, 20 text heads, 12 tapped layers, 16 latent
# channels x 2x2 patches) in diffusers' names; Krea2Transformer2DModel's defaults are the
# same (its SwiGLU widths 16384 = 2/3 x 4 x 6144 and 6912 with them). The text encoder is
# Qwen/Qwen3-VL-4B-Instruct config.json (as public Krea 2 loaders write it out:
# text 2560 x 36 layers, vision tower 24 blocks of 1024); the VAE is Qwen-Image's.
KREA2_TRANSFORMER = RealPart("diffusers", "Krea2Transformer2DModel", {
    "in_channels": 64, "num_layers": 28, "attention_head_dim": 128,
    "num_attention_heads": 48, "num_key_value_heads": 12, "intermediate_size": 16384,
    "timestep_embed_dim": 256, "text_hidden_dim": 2560, "num_text_layers": 12,
    "text_num_attention_heads": 20, "text_num_key_value_heads": 20,
    "text_intermediate_size": 6912, "num_layerwise_text_blocks": 2,
    "num_refiner_text_blocks": 2, "axes_dims_rope": [32, 48, 48]},
    "upstream krea2.py KREA2_MMDIT_CONFIG (= Krea2Transformer2DModel's defaults)")
QWEN3_VL_4B = RealPart("transformers", "Qwen3VLModel", {
    "tie_word_embeddings": True,
    "text_config": {"vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
                    "num_hidden_layers": 36, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 128,
                    "tie_word_embeddings": True,
                    "rope_scaling": {"rope_type": "default", "mrope_interleaved": True,
                                     "mrope_section": [24, 20, 20]}},
    "vision_config": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                      "num_heads": 16, "out_hidden_size": 2560, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "num_position_embeddings": 2304,
                      "deepstack_visual_indexes": [5, 11, 17]}},
    "Qwen/Qwen3-VL-4B-Instruct config.json (Krea 2 text_encoder)")
KREA2 = {"transformer": KREA2_TRANSFORMER, "text_encoder": QWEN3_VL_4B,
         "vae": QWEN_IMAGE_VAE}


def _drop_qwen3_vl_vision(module: nn.Module) -> None:
    """What krea2 loads of Qwen3VLModel: the language model, no vision tower."""
    module.visual = None


# subfolder -> what the arch's loader does to the part after loading it.
KEPT: dict[str, Callable[[nn.Module], None]] = {"text_encoder": _drop_qwen3_vl_vision}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{(repo, k): v for repo in ("krea/Krea-2-Raw", "krea/Krea-2-Turbo")
       for k, v in KREA2.items()},
}
