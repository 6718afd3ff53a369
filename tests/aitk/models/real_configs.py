"""The real, full-size configs of every model part an arch description counts
(aitk/models/<arch>/arch.py `Variant.parts`), keyed by (hub repo, subfolder).

`build` makes a part on the meta device from these values (no memory, no download)
with the class aitk loads it as; tests/aitk/models/test_arch_part_sizes.py holds every
recorded parameter count to what the build counts. Only the keys that shape the weights
are kept (no `_class_name`, token ids, dropout or init ranges); each entry names where
its values were read. Hub repos are gated or too large to fetch here, so the values come
from public code that reproduces the hub's config.json, and the well-known totals they
give (FLUX.1 dev's 11.9B, T5-XXL's 4.76B, SDXL's 2.57B UNet) confirm them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class RealPart:
    library: str  # "diffusers" (or a module of it) or "transformers"
    cls: str  # the class aitk's loader builds this part as
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def build(real: RealPart) -> nn.Module:
    """The part on the meta device: its shapes, no memory."""
    import torch

    with torch.device("meta"):
        if real.library == "aitk":
            from aitk.models.example.transformer import ExampleTransformer

            return ExampleTransformer.from_config(real.config)
        if real.library.startswith("diffusers"):  # or a submodule: diffusers.pipelines.ltx2
            import importlib

            module = importlib.import_module(real.library)
            return getattr(module, real.cls).from_config(real.config)
        import transformers

        cls = getattr(transformers, real.cls)
        return cls(cls.config_class(**real.config))


# ---- shared parts ------------------------------------------------------------------------
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

# Qwen2.5-VL-7B-Instruct, Qwen-Image's text encoder: kohya-ss/musubi-tuner's
# QWEN2_5_VL_CONFIG_JSON (the Qwen-Image text_encoder/config.json).
QWEN25_VL_7B = RealPart("transformers", "Qwen2_5_VLForConditionalGeneration", {
    "text_config": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                    "num_hidden_layers": 28, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "max_position_embeddings": 128000,
                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_channels": 3, "out_hidden_size": 3584,
                      "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                      "hidden_act": "silu"},
    "tie_word_embeddings": False}, "Qwen/Qwen2.5-VL-7B-Instruct (Qwen-Image text_encoder)")

# Qwen-Image's transformer and VAE: diffusers' class defaults are the released config
# (QwenImageTransformer2DModel / AutoencoderKLQwenImage, diffusers 0.42).
QWEN_IMAGE_TRANSFORMER = RealPart("diffusers", "QwenImageTransformer2DModel", {
    "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60,
    "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584,
    "guidance_embeds": False, "axes_dims_rope": [16, 56, 56]},
    "Qwen/Qwen-Image transformer/config.json (= diffusers' defaults)")
QWEN_IMAGE_VAE = RealPart("diffusers", "AutoencoderKLQwenImage", {
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True]},
    "Qwen/Qwen-Image vae/config.json (= diffusers' defaults)")

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

# Z-Image: the transformer config upstream ai-toolkit writes out for single-file loads
# (extensions_built_in/diffusion_models/z_image/z_image_l2p_model.py ZIMAGE_DEFAULT_CONFIG,
# Tongyi-MAI/Z-Image-Turbo transformer/config.json; diffusers' class defaults but for
# axes_lens, which shapes no weight); Qwen3-4B as klein-4B's; FLUX.1's VAE.
ZIMAGE_TRANSFORMER = RealPart("diffusers", "ZImageTransformer2DModel", {
    "all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 3840,
    "n_layers": 30, "n_refiner_layers": 2, "n_heads": 30, "n_kv_heads": 30,
    "norm_eps": 1e-5, "qk_norm": True, "cap_feat_dim": 2560, "siglip_feat_dim": None,
    "rope_theta": 256.0, "t_scale": 1000.0, "axes_dims": [32, 48, 48],
    "axes_lens": [1536, 512, 512]},
    "Tongyi-MAI/Z-Image-Turbo transformer/config.json (upstream's ZIMAGE_DEFAULT_CONFIG)")
QWEN3_4B = RealPart("transformers", "Qwen3Model", {
    **QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True},
    "Qwen/Qwen3-4B config.json (Z-Image text_encoder)")
ZIMAGE = {"transformer": ZIMAGE_TRANSFORMER, "text_encoder": QWEN3_4B, "vae": FLUX_VAE}

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
CLIP_H_VISION = RealPart("transformers", "CLIPVisionModel", {
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
    "num_attention_heads": 16, "patch_size": 14, "image_size": 224, "hidden_act": "gelu",
    "projection_dim": 1024}, "laion/CLIP-ViT-H-14-laion2B-s32B-b79K vision_config")

# LTX-2 (Lightricks/LTX-2): ostris/ai-toolkit's extensions_built_in/diffusion_models/ltx2/
# convert_ltx2_to_diffusers.py (version "2.0": get_ltx2_transformer_config, _connectors_,
# _video_vae_, _audio_vae_, _vocoder_config), which writes the diffusers folders from
# Lightricks' checkpoint; the text encoder is google/gemma-3-12b-it's config.json.
LTX2_SOURCE = "ai-toolkit convert_ltx2_to_diffusers.py (version 2.0)"
LTX2_TRANSFORMER = RealPart("diffusers", "LTX2VideoTransformer3DModel", {
    "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1,
    "num_attention_heads": 32, "attention_head_dim": 128, "cross_attention_dim": 4096,
    "audio_in_channels": 128, "audio_out_channels": 128, "audio_num_attention_heads": 32,
    "audio_attention_head_dim": 64, "audio_cross_attention_dim": 2048, "num_layers": 48,
    "caption_channels": 3840, "rope_type": "split"}, LTX2_SOURCE)
LTX2_CONNECTORS = RealPart("diffusers.pipelines.ltx2", "LTX2TextConnectors", {
    "caption_channels": 3840, "text_proj_in_factor": 49,
    "video_connector_num_attention_heads": 30, "video_connector_attention_head_dim": 128,
    "video_connector_num_layers": 2, "video_connector_num_learnable_registers": 128,
    "audio_connector_num_attention_heads": 30, "audio_connector_attention_head_dim": 128,
    "audio_connector_num_layers": 2, "audio_connector_num_learnable_registers": 128,
    "rope_type": "split", "per_modality_projections": False, "proj_bias": False},
    LTX2_SOURCE)
LTX2_VAE = RealPart("diffusers", "AutoencoderKLLTX2Video", {
    "latent_channels": 128, "block_out_channels": [256, 512, 1024, 2048],
    "decoder_block_out_channels": [256, 512, 1024], "layers_per_block": [4, 6, 6, 2, 2],
    "decoder_layers_per_block": [5, 5, 5, 5], "patch_size": 4, "patch_size_t": 1,
    "decoder_causal": False, "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8}, LTX2_SOURCE)
LTX2_AUDIO_VAE = RealPart("diffusers", "AutoencoderKLLTX2Audio", {
    "base_channels": 128, "ch_mult": [1, 2, 4], "num_res_blocks": 2, "latent_channels": 8,
    "mel_bins": 64}, LTX2_SOURCE)
LTX2_VOCODER = RealPart("diffusers.pipelines.ltx2", "LTX2Vocoder", {
    "in_channels": 128, "hidden_channels": 1024, "out_channels": 2,
    "upsample_kernel_sizes": [16, 15, 8, 4, 4], "upsample_factors": [6, 5, 2, 2, 2],
    "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5]] * 3,
    "output_sampling_rate": 24000}, LTX2_SOURCE)
GEMMA3_12B = RealPart("transformers", "Gemma3ForConditionalGeneration", {
    "text_config": {"vocab_size": 262208, "hidden_size": 3840, "intermediate_size": 15360,
                    "num_hidden_layers": 48, "num_attention_heads": 16,
                    "num_key_value_heads": 8, "head_dim": 256,
                    "max_position_embeddings": 131072, "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "intermediate_size": 4304,
                      "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896,
                      "patch_size": 14},
    "mm_tokens_per_image": 256}, "google/gemma-3-12b-it config.json (LTX-2 text_encoder)")

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
# HiDream-I1 (Full, Dev and Fast share the shapes): transformer/config.json as diffusers'
# convert_hidream_to_diffusers.py writes it; Llama 3.1 8B Instruct's config.json (the
# base LlamaModel aitk loads as text_encoder_4); T5-XXL and FLUX.1's VAE as above.
HIDREAM = {
    "transformer": RealPart("diffusers", "HiDreamImageTransformer2DModel", {
        "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 16,
        "num_single_layers": 32, "attention_head_dim": 128, "num_attention_heads": 20,
        "caption_channels": [4096, 4096], "text_emb_dim": 2048, "num_routed_experts": 4,
        "num_activated_experts": 2, "axes_dims_rope": [64, 32, 32],
        "max_resolution": [128, 128], "llama_layers": [*range(32), *[31] * 16]},
        "HiDream-ai/HiDream-I1-Full transformer/config.json (diffusers' conversion script)"),
    "text_encoder_3": T5_XXL,
    "text_encoder_4": RealPart("transformers", "LlamaModel", {
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "tie_word_embeddings": False},
        "meta-llama/Llama-3.1-8B-Instruct config.json (HiDream's text_encoder_4)"),
    "vae": FLUX_VAE,
}

# Lumina-Image 2.0: transformer/config.json of Alpha-VLLM/Lumina-Image-2.0 (diffusers'
# Lumina2Transformer2DModel defaults are this model, but for the caption width: Gemma 2
# 2B's 2304) and google/gemma-2-2b's config.json (its text_encoder); FLUX.1's VAE.
LUMINA2 = {
    "transformer": RealPart("diffusers", "Lumina2Transformer2DModel", {
        "sample_size": 128, "patch_size": 2, "in_channels": 16, "hidden_size": 2304,
        "num_layers": 26, "num_refiner_layers": 2, "num_attention_heads": 24,
        "num_kv_heads": 8, "multiple_of": 256, "ffn_dim_multiplier": None,
        "norm_eps": 1e-5, "axes_dim_rope": [32, 32, 32], "axes_lens": [300, 512, 512],
        "cap_feat_dim": 2304}, "Alpha-VLLM/Lumina-Image-2.0 transformer/config.json"),
    "text_encoder": RealPart("transformers", "Gemma2Model", {
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256}, "google/gemma-2-2b config.json (Lumina-Image-2.0 text_encoder)"),
    "vae": FLUX_VAE,
}

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


def _flux1(guidance: bool) -> RealPart:
    return RealPart("diffusers", "FluxTransformer2DModel",
                    {**FLUX1_TRANSFORMER, "guidance_embeds": guidance},
                    "black-forest-labs/FLUX.1-dev transformer/config.json (schnell: "
                    "guidance_embeds false), e.g. as tenstorrent/tt-forge-models writes it")


def _klein(layers: int, single: int, heads: int, text_dim: int, hidden: int,
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


def _wan22(in_channels: int, source: str) -> dict[str, RealPart]:
    expert = RealPart("diffusers", "WanTransformer3DModel",
                      {**WAN_14B, "in_channels": in_channels}, source)
    return {"transformer": expert, "transformer_2": expert, "text_encoder": UMT5_XXL,
            "vae": WAN_VAE}


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

def _example_base() -> dict[str, RealPart]:
    """The shipped example base model: its configs are in the checkout."""
    import json

    root = REPO_ROOT / "aitk/models/example/base"

    def read(part: str) -> dict[str, Any]:
        data = json.loads((root / part / "config.json").read_text(encoding="utf-8"))
        return {k: v for k, v in data.items() if not k.startswith("_")}

    source = "aitk/models/example/base (shipped)"
    return {"transformer": RealPart("aitk", "ExampleTransformer", read("transformer"), source),
            "text_encoder": RealPart("transformers", "T5EncoderModel", read("text_encoder"),
                                     source),
            "vae": RealPart("diffusers", "AutoencoderKL", read("vae"), source)}


QWEN_IMAGE = {"transformer": QWEN_IMAGE_TRANSFORMER, "text_encoder": QWEN25_VL_7B,
              "vae": QWEN_IMAGE_VAE}
FLUX1 = {"text_encoder": CLIP_L_TEXT, "text_encoder_2": T5_XXL, "vae": FLUX_VAE}

# (hub repo, subfolder) -> the real part. The repo is the variant's first hub id.
REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("black-forest-labs/FLUX.1-dev", k): v for k, v in
       {**FLUX1, "transformer": _flux1(True)}.items()},
    **{("black-forest-labs/FLUX.1-schnell", k): v for k, v in
       {**FLUX1, "transformer": _flux1(False)}.items()},
    # Kontext dev has FLUX.1 dev's shapes (guidance embedding included).
    **{("black-forest-labs/FLUX.1-Kontext-dev", k): v for k, v in
       {**FLUX1, "transformer": _flux1(True)}.items()},
    **{(f"HiDream-ai/HiDream-I1-{tag}", k): v for tag in ("Full", "Dev", "Fast")
       for k, v in HIDREAM.items()},
    **{("Alpha-VLLM/Lumina-Image-2.0", k): v for k, v in LUMINA2.items()},
    ("lodestones/Chroma1-HD", "transformer"): RealPart(
        "diffusers", "ChromaTransformer2DModel", {
            "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38,
            "attention_head_dim": 128, "num_attention_heads": 24,
            "joint_attention_dim": 4096, "axes_dims_rope": [16, 56, 56],
            "approximator_num_channels": 64, "approximator_hidden_dim": 5120,
            "approximator_layers": 5},
        "lodestones/Chroma1-HD transformer/config.json, as invoke-ai/InvokeAI's "
        "CHROMA_TRANSFORMER_CONFIG writes it"),
    ("lodestones/Chroma1-HD", "text_encoder"): T5_XXL,
    ("lodestones/Chroma1-HD", "vae"): FLUX_VAE,
    **{("black-forest-labs/FLUX.2-klein-base-4B", k): v for k, v in
       _klein(5, 20, 24, 7680, 2560, 9728, tied=True).items()},
    **{("black-forest-labs/FLUX.2-klein-base-9B", k): v for k, v in
       _klein(8, 24, 32, 12288, 4096, 12288, tied=False).items()},
    **{("Qwen/Qwen-Image", k): v for k, v in QWEN_IMAGE.items()},
    **{("Qwen/Qwen-Image-Edit", k): v for k, v in QWEN_IMAGE.items()},
    **{("Qwen/Qwen-Image-Edit-2509", k): v for k, v in QWEN_IMAGE.items()},
    **{("Lightricks/LTX-2", k): v for k, v in
       {"transformer": LTX2_TRANSFORMER, "text_encoder": GEMMA3_12B,
        "connectors": LTX2_CONNECTORS, "vae": LTX2_VAE, "audio_vae": LTX2_AUDIO_VAE,
        "vocoder": LTX2_VOCODER}.items()},
    **{("stabilityai/stable-diffusion-3.5-large", k): v for k, v in _sd35("large").items()},
    **{("stabilityai/stable-diffusion-3.5-medium", k): v for k, v in _sd35("medium").items()},
    ("stabilityai/stable-diffusion-xl-base-1.0", "unet"): SDXL_UNET,
    ("stabilityai/stable-diffusion-xl-base-1.0", "text_encoder"): CLIP_L_TEXT,
    ("stabilityai/stable-diffusion-xl-base-1.0", "text_encoder_2"): SDXL_TEXT_2,
    ("stabilityai/stable-diffusion-xl-base-1.0", "vae"): SDXL_VAE,
    **{("stable-diffusion-v1-5/stable-diffusion-v1-5", k): v for k, v in
       {"unet": SD1_UNET, "text_encoder": CLIP_L_TEXT, "vae": SD_VAE}.items()},
    **{(repo, k): v for repo in ("stabilityai/stable-diffusion-2-1",
                                 "stabilityai/stable-diffusion-2-1-base")
       for k, v in {"unet": SD2_UNET, "text_encoder": SD2_TEXT, "vae": SD_VAE}.items()},
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
    **{("Wan-AI/Wan2.2-T2V-A14B-Diffusers", k): v for k, v in
       _wan22(16, "diffusers convert_wan_to_diffusers.py Wan2.2-T2V-A14B").items()},
    **{("Wan-AI/Wan2.2-I2V-A14B-Diffusers", k): v for k, v in
       _wan22(36, "diffusers convert_wan_to_diffusers.py Wan2.2-I2V-14B-720p").items()},
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "transformer"): WAN22_5B_TRANSFORMER,
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "text_encoder"): UMT5_XXL,
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "vae"): WAN22_VAE,
    **{(repo, part): real for repo in ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                                       "Wan-AI/Wan2.1-T2V-14B-Diffusers",
                                       "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers")
       for part, real in (("text_encoder", UMT5_XXL), ("vae", WAN_VAE))},
    **{("aitk/models/example/base", k): v for k, v in _example_base().items()},
    **{("black-forest-labs/FLUX.2-dev", k): v for k, v in FLUX2_DEV.items()},
    **{(repo, k): v for repo in ("Tongyi-MAI/Z-Image-Turbo", "Tongyi-MAI/Z-Image",
                                 "ostris/Z-Image-De-Turbo") for k, v in ZIMAGE.items()},
    **{(repo, k): v for repo in ("krea/Krea-2-Raw", "krea/Krea-2-Turbo")
       for k, v in KREA2.items()},
}
