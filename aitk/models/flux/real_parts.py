"""The real, full-size configs of FLUX.1 dev and schnell's parts (the shapes only: no
weights), keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used
and checked."""

from __future__ import annotations

from aitk.models.real_parts import RealPart

# FLUX.1's (and Chroma's) T5 v1.1 XXL encoder: text_encoder_2/config.json of
# black-forest-labs/FLUX.1-dev, as invoke-ai/InvokeAI's Chroma loader writes it out.
T5_XXL = RealPart("transformers", "T5EncoderModel", {
    "vocab_size": 32128, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24,
    "num_heads": 64, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False}, "google/t5-v1_1-xxl (FLUX.1-dev text_encoder_2)")

# CLIP ViT-L/14's text tower (FLUX.1 text_encoder, SDXL text_encoder, SD 1.5 text_encoder).
CLIP_L_TEXT = RealPart("transformers", "CLIPTextModel", {
    "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072,
    "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 77,
    "hidden_act": "quick_gelu", "projection_dim": 768},
    "openai/clip-vit-large-patch14 text_config (FLUX.1-dev / SDXL text_encoder)")

# FLUX.1's VAE (16 latent channels, no quant convs): FLUX.1-dev vae/config.json.
FLUX_VAE = RealPart("diffusers", "AutoencoderKL", {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "layers_per_block": 2, "norm_num_groups": 32, "act_fn": "silu", "sample_size": 1024,
    "scaling_factor": 0.3611, "shift_factor": 0.1159, "use_quant_conv": False,
    "use_post_quant_conv": False}, "black-forest-labs/FLUX.1-dev vae/config.json")

FLUX1_TRANSFORMER = {
    "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38,
    "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 4096,
    "pooled_projection_dim": 768, "axes_dims_rope": [16, 56, 56]}


def flux1_transformer(guidance: bool) -> RealPart:
    return RealPart("diffusers", "FluxTransformer2DModel",
                    {**FLUX1_TRANSFORMER, "guidance_embeds": guidance},
                    "black-forest-labs/FLUX.1-dev transformer/config.json (schnell: "
                    "guidance_embeds false), e.g. as tenstorrent/tt-forge-models writes it")


FLUX1 = {"text_encoder": CLIP_L_TEXT, "text_encoder_2": T5_XXL, "vae": FLUX_VAE}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("black-forest-labs/FLUX.1-dev", k): v for k, v in
       {**FLUX1, "transformer": flux1_transformer(True)}.items()},
    **{("black-forest-labs/FLUX.1-schnell", k): v for k, v in
       {**FLUX1, "transformer": flux1_transformer(False)}.items()},
}
