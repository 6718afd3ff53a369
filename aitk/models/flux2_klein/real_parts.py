"""The real, full-size configs of FLUX.2 [klein]'s parts (the shapes only: no weights),
keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used and
checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aitk.models.real_parts import RealPart

if TYPE_CHECKING:
    from torch import nn


# FLUX.2 [klein]: huggingface/diffusers scripts/convert_flux2_to_diffusers.py
# (get_flux2_transformer_config "klein-4b" / "klein-9b"; the VAE is AutoencoderKLFlux2()).
KLEIN_TRANSFORMER = {
    "patch_size": 1, "in_channels": 128, "attention_head_dim": 128,
    "timestep_guidance_channels": 256, "mlp_ratio": 3.0, "axes_dims_rope": [32, 32, 32, 32],
    "rope_theta": 2000, "eps": 1e-6, "guidance_embeds": False}
FLUX2_VAE = RealPart("diffusers", "AutoencoderKLFlux2", {},
                     "diffusers convert_flux2_to_diffusers.py: AutoencoderKLFlux2() defaults")
QWEN3 = {"vocab_size": 151936, "num_hidden_layers": 36, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960}


def klein_parts(layers: int, single: int, heads: int, text_dim: int, hidden: int,
           ffn: int, tied: bool) -> dict[str, RealPart]:
    source = "diffusers convert_flux2_to_diffusers.py"
    return {
        "transformer": RealPart("diffusers", "Flux2Transformer2DModel", {
            **KLEIN_TRANSFORMER, "num_layers": layers, "num_single_layers": single,
            "num_attention_heads": heads, "joint_attention_dim": text_dim}, source),
        "text_encoder": RealPart("transformers", "Qwen3Model", {
            **QWEN3, "hidden_size": hidden, "intermediate_size": ffn,
            "tie_word_embeddings": tied}, f"Qwen/Qwen3-{'4B' if tied else '8B'} config.json"),
        "vae": FLUX2_VAE,
    }


def _keep_text_layers(module: nn.Module) -> None:
    from aitk.models.flux2_klein.model import TEXT_LAYERS, keep_text_layers

    keep_text_layers(module, max(TEXT_LAYERS) + 1)


# subfolder -> what the arch's loader does to the part after loading it.
KEPT: dict[str, Callable[[nn.Module], None]] = {"text_encoder": _keep_text_layers}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("black-forest-labs/FLUX.2-klein-base-4B", k): v for k, v in
       klein_parts(5, 20, 24, 7680, 2560, 9728, tied=True).items()},
    **{("black-forest-labs/FLUX.2-klein-base-9B", k): v for k, v in
       klein_parts(8, 24, 32, 12288, 4096, 12288, tied=False).items()},
}
