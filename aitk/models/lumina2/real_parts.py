"""The real, full-size configs of Lumina-Image 2.0's parts (the shapes only: no weights),
keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used and
checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import FLUX_VAE
from aitk.models.real_parts import RealPart

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


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("Alpha-VLLM/Lumina-Image-2.0", k): v for k, v in LUMINA2.items()},
}
