"""The real, full-size configs of Chroma's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import FLUX_VAE, T5_XXL
from aitk.models.real_parts import RealPart

REAL_PARTS: dict[tuple[str, str], RealPart] = {
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
}
