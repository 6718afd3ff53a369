"""Build a tiny random-initialised Wan 2.2 TI2V 5B folder (no download), in the diffusers
layout `WanPipeline.from_pretrained(folder)` reads:

    transformer/     WanTransformer3DModel (1 block, 2 heads of 16, patch (1, 2, 2)),
                     latent channels in and out (no condition channels: TI2V puts the
                     first frame's latents in place of the first latent frame)
    vae/             AutoencoderKLWan, the 2.2 kind: residual, pixels patchified 2x2
                     into 12 channels, 16x space and 4x time (base_dim 8, z_dim 4)
    text_encoder/, tokenizer/   as every tiny Wan (aitk.models.wan21.tiny)
    scheduler/       UniPC flow prediction with flow_shift 5.0 (the 5B repo's)
    model_index.json WanPipeline with `expand_timesteps` (one timestep per token)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from aitk.models.wan21.tiny import (
    WAN21,
    WanSizes,
    save_scheduler,
    save_tiny_text_encoder,
    tiny_transformer,
)
from aitk_common.files import staged_dir

FLOW_SHIFT = 5.0  # Wan2.2-TI2V-5B's sample_shift (upstream trains with shift 5.0 too)
SIZES = WanSizes()

MODEL_INDEX = {
    "_class_name": "WanPipeline",
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "ByT5Tokenizer"],
    "transformer": ["diffusers", "WanTransformer3DModel"],
    "transformer_2": [None, None],
    "vae": ["diffusers", "AutoencoderKLWan"],
    "boundary_ratio": None,
    "expand_timesteps": True,
}


def tiny_vae(sizes: WanSizes = SIZES):
    """The Wan 2.2 VAE's shape at toy size: residual, patch 2 (12 pixel channels), 16x."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=sizes.vae_base_dim, decoder_base_dim=sizes.vae_base_dim, z_dim=sizes.z_dim,
        dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
        in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
        scale_factor_temporal=4, is_residual=True,
        latents_mean=[0.1, -0.2, 0.05, 0.3][:sizes.z_dim],
        latents_std=[1.5, 0.8, 1.2, 2.0][:sizes.z_dim])


def build_tiny_wan22_5b(target: Path, seed: int = 0, sizes: WanSizes = SIZES,
                        overwrite: bool = False) -> Path:
    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        save_tiny_text_encoder(tmp, sizes)
        tiny_vae(sizes).save_pretrained(tmp / "vae")
        tiny_transformer(sizes, WAN21).save_pretrained(tmp / "transformer")
        save_scheduler(tmp, flow_shift=FLOW_SHIFT)
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return target
