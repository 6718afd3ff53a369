"""The real, full-size configs of SD 3.5's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import CLIP_L_TEXT, FLUX_VAE, T5_XXL
from aitk.models.real_parts import RealPart
from aitk.models.sdxl.real_parts import SDXL_TEXT_2

# SD 3.5: transformer/config.json of stabilityai/stable-diffusion-3.5-large and -medium
# (diffusers' convert_sd3_to_diffusers.py derives them from the checkpoints; e.g. as
# tenstorrent/tt-forge-models writes both out). The text encoders are CLIP-L and bigG
# with their projections and FLUX.1's T5-XXL; the VAE has FLUX.1's shapes.
SD35_TRANSFORMER = {
    "sample_size": 128, "patch_size": 2, "in_channels": 16, "out_channels": 16,
    "attention_head_dim": 64, "joint_attention_dim": 4096, "pooled_projection_dim": 2048,
    "qk_norm": "rms_norm"}
SD35_SOURCE = "stabilityai/stable-diffusion-3.5-{} transformer/config.json"
CLIP_L_PROJECTED = RealPart("transformers", "CLIPTextModelWithProjection", CLIP_L_TEXT.config,
                            "openai/clip-vit-large-patch14 text_config (SD 3.5 text_encoder)")
SD35_VAE = RealPart("diffusers", "AutoencoderKL", {
    **FLUX_VAE.config, "scaling_factor": 1.5305, "shift_factor": 0.0609},
    "stabilityai/stable-diffusion-3.5-large vae/config.json")


def _sd35(size: str) -> dict[str, RealPart]:
    shapes = ({"num_layers": 38, "num_attention_heads": 38, "caption_projection_dim": 2432,
               "pos_embed_max_size": 192, "dual_attention_layers": []} if size == "large" else
              {"num_layers": 24, "num_attention_heads": 24, "caption_projection_dim": 1536,
               "pos_embed_max_size": 384, "dual_attention_layers": list(range(13))})
    return {"transformer": RealPart("diffusers", "SD3Transformer2DModel",
                                    {**SD35_TRANSFORMER, **shapes}, SD35_SOURCE.format(size)),
            "text_encoder": CLIP_L_PROJECTED, "text_encoder_2": SDXL_TEXT_2,
            "text_encoder_3": T5_XXL, "vae": SD35_VAE}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("stabilityai/stable-diffusion-3.5-large", k): v for k, v in _sd35("large").items()},
    **{("stabilityai/stable-diffusion-3.5-medium", k): v for k, v in _sd35("medium").items()},
}
