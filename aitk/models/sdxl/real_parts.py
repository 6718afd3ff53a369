"""The real, full-size configs of SDXL's parts (the shapes only: no weights), keyed by (hub
repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import CLIP_L_TEXT
from aitk.models.real_parts import RealPart

# SDXL base 1.0 (stabilityai/stable-diffusion-xl-base-1.0 */config.json).
SDXL_UNET = RealPart("diffusers", "UNet2DConditionModel", {
    "sample_size": 128, "in_channels": 4, "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280], "layers_per_block": 2,
    "attention_head_dim": [5, 10, 20], "cross_attention_dim": 2048,
    "transformer_layers_per_block": [1, 2, 10], "use_linear_projection": True,
    "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816, "norm_num_groups": 32},
    "stabilityai/stable-diffusion-xl-base-1.0 unet/config.json")
SDXL_TEXT_2 = RealPart("transformers", "CLIPTextModelWithProjection", {
    "vocab_size": 49408, "hidden_size": 1280, "intermediate_size": 5120,
    "num_hidden_layers": 32, "num_attention_heads": 20, "max_position_embeddings": 77,
    "hidden_act": "gelu", "projection_dim": 1280},
    "stabilityai/stable-diffusion-xl-base-1.0 text_encoder_2/config.json (OpenCLIP bigG)")
SDXL_VAE = RealPart("diffusers", "AutoencoderKL", {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4,
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "layers_per_block": 2, "norm_num_groups": 32, "act_fn": "silu", "sample_size": 1024,
    "scaling_factor": 0.13025}, "stabilityai/stable-diffusion-xl-base-1.0 vae/config.json")


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    ("stabilityai/stable-diffusion-xl-base-1.0", "unet"): SDXL_UNET,
    ("stabilityai/stable-diffusion-xl-base-1.0", "text_encoder"): CLIP_L_TEXT,
    ("stabilityai/stable-diffusion-xl-base-1.0", "text_encoder_2"): SDXL_TEXT_2,
    ("stabilityai/stable-diffusion-xl-base-1.0", "vae"): SDXL_VAE,
}
