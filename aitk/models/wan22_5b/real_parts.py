"""The real, full-size configs of Wan 2.2 TI2V 5B's parts (the shapes only: no weights),
keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used and
checked."""

from __future__ import annotations

from aitk.models.real_parts import RealPart
from aitk.models.wan21.real_parts import UMT5_XXL, WAN_TRANSFORMER

# Wan 2.2 TI2V 5B: the transformer as the Wan team's ti2v_5B config gives it (dim 3072 =
# 24 heads x 128, ffn 14336, 30 layers; Wan-Video/Wan2.2 wan/configs/wan_ti2v_5B.py, as
# ml-explore/mlx-examples carries it) with 48 latent channels in and out; the VAE is
# Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json, as invoke-ai/InvokeAI's Wan loader
# writes it out (_WAN_TI2V_5B_VAE_CONFIG).
WAN22_5B_TRANSFORMER = RealPart("diffusers", "WanTransformer3DModel", {
    **WAN_TRANSFORMER, "ffn_dim": 14336, "num_attention_heads": 24, "num_layers": 30,
    "in_channels": 48, "out_channels": 48},
    "Wan-Video/Wan2.2 wan/configs/wan_ti2v_5B.py (transformer/config.json)")
WAN22_VAE = RealPart("diffusers", "AutoencoderKLWan", {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True],
    "in_channels": 12, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
    "scale_factor_temporal": 4, "is_residual": True},
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json (as invoke-ai/InvokeAI writes it)")


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "transformer"): WAN22_5B_TRANSFORMER,
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "text_encoder"): UMT5_XXL,
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "vae"): WAN22_VAE,
}
