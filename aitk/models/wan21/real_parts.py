"""The real, full-size configs of Wan 2.1's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.real_parts import RealPart

# Wan: huggingface/diffusers scripts/convert_wan_to_diffusers.py (get_transformer_config);
# the 2.1 VAE is AutoencoderKLWan() with its defaults, the text encoder google/umt5-xxl,
# the 2.1 i2v image encoder laion/CLIP-ViT-H-14-laion2B-s32B-b79K's vision tower.
WAN_TRANSFORMER = {
    "patch_size": [1, 2, 2], "attention_head_dim": 128, "cross_attn_norm": True,
    "eps": 1e-6, "freq_dim": 256, "out_channels": 16, "qk_norm": "rms_norm_across_heads",
    "text_dim": 4096}
WAN_14B = {**WAN_TRANSFORMER, "ffn_dim": 13824, "num_attention_heads": 40, "num_layers": 40}
WAN_T2V_14B = RealPart("diffusers", "WanTransformer3DModel", {**WAN_14B, "in_channels": 16},
                       "diffusers convert_wan_to_diffusers.py Wan-T2V-14B")
UMT5_XXL = RealPart("transformers", "UMT5EncoderModel", {
    "vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24,
    "num_heads": 64, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False}, "google/umt5-xxl (Wan text_encoder)")
WAN_VAE = RealPart("diffusers", "AutoencoderKLWan", {},
                   "diffusers convert_wan_to_diffusers.py: AutoencoderKLWan() defaults")
CLIP_H_VISION = RealPart("transformers", "CLIPVisionModel", {
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
    "num_attention_heads": 16, "patch_size": 14, "image_size": 224, "hidden_act": "gelu",
    "projection_dim": 1024}, "laion/CLIP-ViT-H-14-laion2B-s32B-b79K vision_config")


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "transformer"): RealPart(
        "diffusers", "WanTransformer3DModel",
        {**WAN_TRANSFORMER, "ffn_dim": 8960, "num_attention_heads": 12, "num_layers": 30,
         "in_channels": 16}, "diffusers convert_wan_to_diffusers.py Wan-T2V-1.3B"),
    ("Wan-AI/Wan2.1-T2V-14B-Diffusers", "transformer"): WAN_T2V_14B,
    ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "transformer"): RealPart(
        "diffusers", "WanTransformer3DModel",
        {**WAN_14B, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120},
        "diffusers convert_wan_to_diffusers.py Wan-I2V-14B-480p"),
    ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "image_encoder"): CLIP_H_VISION,
    **{(repo, part): real for repo in ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                                       "Wan-AI/Wan2.1-T2V-14B-Diffusers",
                                       "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers")
       for part, real in (("text_encoder", UMT5_XXL), ("vae", WAN_VAE))},
}
