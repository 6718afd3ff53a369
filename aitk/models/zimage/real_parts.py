"""The real, full-size configs of Z-Image's parts (the shapes only: no weights), keyed by
(hub repo, subfolder); aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import FLUX_VAE
from aitk.models.flux2_klein.real_parts import QWEN3
from aitk.models.real_parts import RealPart

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


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{(repo, k): v for repo in ("Tongyi-MAI/Z-Image-Turbo", "Tongyi-MAI/Z-Image",
                                 "ostris/Z-Image-De-Turbo") for k, v in ZIMAGE.items()},
}
