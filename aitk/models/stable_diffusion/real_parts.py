"""The real, full-size configs of Stable Diffusion 1.5 and 2.x's parts (the shapes only: no
weights), keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used
and checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import CLIP_L_TEXT
from aitk.models.real_parts import RealPart
from aitk.models.sdxl.real_parts import SDXL_VAE

# Stable Diffusion 1.5 and 2.1: kohya-ss/sd-scripts library/model_util.py, the constants
# its create_unet_diffusers_config / create_vae_diffusers_config read (UNET_PARAMS_*,
# V2_UNET_PARAMS_*: heads 8 / [5, 10, 20, 20], context 768 / 1024; 2.x with linear
# projections, as the hub's 2.1 unet/config.json) and its 2.x CLIPTextConfig (OpenCLIP-H
# with 23 of 24 layers); 1.x's text encoder is CLIP ViT-L (above). They give the
# well-known 859.5M and 865.9M UNets.
SD_UNET = {
    "in_channels": 4, "out_channels": 4,
    "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
    "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
    "block_out_channels": [320, 640, 1280, 1280], "layers_per_block": 2,
    "norm_num_groups": 32}
SD1_UNET = RealPart("diffusers", "UNet2DConditionModel", {
    **SD_UNET, "sample_size": 64, "attention_head_dim": 8, "cross_attention_dim": 768},
    "kohya-ss/sd-scripts library/model_util.py (v1; runwayml/stable-diffusion-v1-5 "
    "unet/config.json)")
SD2_UNET = RealPart("diffusers", "UNet2DConditionModel", {
    **SD_UNET, "sample_size": 96, "attention_head_dim": [5, 10, 20, 20],
    "cross_attention_dim": 1024, "use_linear_projection": True, "upcast_attention": True},
    "kohya-ss/sd-scripts library/model_util.py (v2; stabilityai/stable-diffusion-2-1 "
    "unet/config.json)")
SD2_TEXT = RealPart("transformers", "CLIPTextModel", {
    "vocab_size": 49408, "hidden_size": 1024, "intermediate_size": 4096,
    "num_hidden_layers": 23, "num_attention_heads": 16, "max_position_embeddings": 77,
    "hidden_act": "gelu", "projection_dim": 512},
    "kohya-ss/sd-scripts library/model_util.py v2 CLIPTextConfig "
    "(stabilityai/stable-diffusion-2-1 text_encoder/config.json)")
# SD 1.x/2.x's VAE: SDXL's architecture with scale 0.18215 (model_util.py VAE_PARAMS_*).
SD_VAE = RealPart("diffusers", "AutoencoderKL", {**SDXL_VAE.config, "sample_size": 512,
                                                 "scaling_factor": 0.18215},
                  "kohya-ss/sd-scripts library/model_util.py create_vae_diffusers_config")


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("stable-diffusion-v1-5/stable-diffusion-v1-5", k): v for k, v in
       {"unet": SD1_UNET, "text_encoder": CLIP_L_TEXT, "vae": SD_VAE}.items()},
    **{(repo, k): v for repo in ("stabilityai/stable-diffusion-2-1",
                                 "stabilityai/stable-diffusion-2-1-base")
       for k, v in {"unet": SD2_UNET, "text_encoder": SD2_TEXT, "vae": SD_VAE}.items()},
}
