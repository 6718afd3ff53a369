"""The real, full-size configs of Ideogram 4's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aitk.models.flux2_klein.real_parts import FLUX2_VAE
from aitk.models.real_parts import RealPart

if TYPE_CHECKING:
    from torch import nn


# Ideogram 4: both transformers are upstream ai-toolkit's Ideogram4Config
# (extensions_built_in/diffusion_models/ideogram4/src/transformer.py: emb_dim 4608 =
# 18 heads x 256, 34 layers, intermediate 12288, adanln_dim 512, 128 = 32 latent
# channels x 2x2 patches, llm features 4096 x 13 tapped Qwen3-VL layers, rope theta
# 5e6, mrope (24, 20, 20)) in diffusers' names; Ideogram4Transformer2DModel's
# defaults are the same, and the pipeline's `unconditional_transformer` is built from
# the same class and config. The text encoder is Qwen/Qwen3-VL-8B-Instruct config.json
# (upstream's QWEN3_VL_PATH: text 4096 x 36 layers, vision tower 27 blocks of 1152);
# the VAE is FLUX.2's (AutoencoderKLFlux2, the pipeline's `vae` type).
IDEOGRAM4_TRANSFORMER = RealPart("diffusers", "Ideogram4Transformer2DModel", {
    "in_channels": 128, "num_layers": 34, "attention_head_dim": 256,
    "num_attention_heads": 18, "intermediate_size": 12288, "adaln_dim": 512,
    "llm_features_dim": 53248, "rope_theta": 5_000_000, "mrope_section": [24, 20, 20],
    "norm_eps": 1e-5},
    "upstream ideogram4 src/transformer.py Ideogram4Config "
    "(= Ideogram4Transformer2DModel's defaults)")
QWEN3_VL_8B = RealPart("transformers", "Qwen3VLModel", {
    "tie_word_embeddings": False,
    "text_config": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                    "num_hidden_layers": 36, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 128,
                    "tie_word_embeddings": False,
                    "rope_scaling": {"rope_type": "default", "mrope_interleaved": True,
                                     "mrope_section": [24, 20, 20]}},
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "out_hidden_size": 4096, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "num_position_embeddings": 2304,
                      "deepstack_visual_indexes": [8, 16, 24]}},
    "Qwen/Qwen3-VL-8B-Instruct config.json (upstream ideogram4.py QWEN3_VL_PATH)")
IDEOGRAM4 = {"transformer": IDEOGRAM4_TRANSFORMER,
             "unconditional_transformer": IDEOGRAM4_TRANSFORMER,
             "text_encoder": QWEN3_VL_8B, "vae": FLUX2_VAE}


def _drop_qwen3_vl_vision(module: nn.Module) -> None:
    """What ideogram4 loads of Qwen3VLModel: the language model, no vision tower."""
    module.visual = None


# subfolder -> what the arch's loader does to the part after loading it.
KEPT: dict[str, Callable[[nn.Module], None]] = {"text_encoder": _drop_qwen3_vl_vision}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    ("ideogram-ai/ideogram-v4", k): v for k, v in IDEOGRAM4.items()}
