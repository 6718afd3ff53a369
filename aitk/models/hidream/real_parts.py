"""The real, full-size configs of HiDream-I1's parts (the shapes only: no weights), keyed
by (hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import FLUX_VAE, T5_XXL
from aitk.models.real_parts import RealPart

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


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{(f"HiDream-ai/HiDream-I1-{tag}", k): v for tag in ("Full", "Dev", "Fast")
       for k, v in HIDREAM.items()},
}
