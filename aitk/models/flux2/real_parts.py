"""The real, full-size configs of FLUX.2 [dev]'s parts (the shapes only: no weights), keyed
by (hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aitk.models.flux2_klein.real_parts import FLUX2_VAE
from aitk.models.real_parts import RealPart

if TYPE_CHECKING:
    from torch import nn


# FLUX.2 [dev]: diffusers convert_flux2_to_diffusers.py get_flux2_transformer_config
# "flux2-dev" (= Flux2Transformer2DModel's defaults, guidance embedding on); Mistral Small
# 3.1 24B: transformers' Mistral3Config defaults ("similar to
# mistralai/Mistral-Small-3.1-24B-Instruct-2503"), its LM head untied (24.01B in all).
FLUX2_DEV = {
    "transformer": RealPart("diffusers", "Flux2Transformer2DModel", {
        "patch_size": 1, "in_channels": 128, "num_layers": 8, "num_single_layers": 48,
        "attention_head_dim": 128, "num_attention_heads": 48, "joint_attention_dim": 15360,
        "timestep_guidance_channels": 256, "mlp_ratio": 3.0,
        "axes_dims_rope": [32, 32, 32, 32], "rope_theta": 2000, "eps": 1e-6,
        "guidance_embeds": True}, "diffusers convert_flux2_to_diffusers.py flux2-dev"),
    "text_encoder": RealPart("transformers", "Mistral3ForConditionalGeneration", {
        "tie_word_embeddings": False,
        "text_config": {"model_type": "mistral", "vocab_size": 131072, "hidden_size": 5120,
                        "intermediate_size": 32768, "num_hidden_layers": 40,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                        "max_position_embeddings": 131072, "tie_word_embeddings": False}},
        "transformers Mistral3Config defaults (Mistral-Small-3.1-24B-Instruct-2503)"),
    "vae": FLUX2_VAE,
}


def _mistral_language_model_to_layer_31(module: nn.Module) -> None:
    """What flux2 loads of Mistral3ForConditionalGeneration: the language model, cut
    after layer 31 (one past the deepest read), without the vision side or LM head."""
    from aitk.models.flux2.model import TEXT_LAYERS
    from aitk.models.flux2_klein.model import keep_text_layers

    module.model.vision_tower = None
    module.model.multi_modal_projector = None
    module.lm_head = None
    keep_text_layers(module.model.language_model, max(TEXT_LAYERS) + 1)


# subfolder -> what the arch's loader does to the part after loading it.
KEPT: dict[str, Callable[[nn.Module], None]] = {
    "text_encoder": _mistral_language_model_to_layer_31}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("black-forest-labs/FLUX.2-dev", k): v for k, v in FLUX2_DEV.items()},
}
