"""The real, full-size configs of LTX-2's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.real_parts import RealPart

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


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("Lightricks/LTX-2", k): v for k, v in
       {"transformer": LTX2_TRANSFORMER, "text_encoder": GEMMA3_12B,
        "connectors": LTX2_CONNECTORS, "vae": LTX2_VAE, "audio_vae": LTX2_AUDIO_VAE,
        "vocoder": LTX2_VOCODER}.items()},
}
