"""Build a tiny random-initialised Stable Diffusion 1.x or 2.x folder, with no download.

The layout is the hub's (`model_index.json`, `unet/`, `vae/`, `text_encoder/`,
`tokenizer/`, `scheduler/`), written by `StableDiffusionPipeline.save_pretrained`, so the
folder loads both through the arch's `load_model` and diffusers' own
`StableDiffusionPipeline.from_pretrained`. The shapes keep each version's structure at
toy sizes:

- 1.x: CLIP with quick-GELU, the UNet's cross-attention width = the encoder's, conv
  in/out projections of the transformer blocks, epsilon, PNDM previews (SD 1.5's
  scheduler), the tokenizer padding with `<|endoftext|>`;
- 2.x: OpenCLIP's GELU, linear projections, attention upcast, v-prediction and DDIM
  previews (SD 2.1's 768-v scheduler), the tokenizer padding with `!`.

Both: two UNet levels (attention in the first down and last up block, as SD's
attention sits at the high resolutions), SD's betas and VAE scale 0.18215. The CLIP
tokenizer is the byte-level one the tiny SDXL builds (aitk.models.sdxl.tiny).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.sdxl.tiny import EOS, MAX_TOKENS, write_clip_tokenizer
from aitk_common.files import staged_dir


@dataclass(frozen=True)
class TinySDVersion:
    """What differs between the tiny 1.x and 2.x models (as between the real ones)."""

    hidden_act: str
    pad_token: str
    linear_projection: bool
    upcast_attention: bool
    prediction_type: str


SD1 = TinySDVersion("quick_gelu", EOS, linear_projection=False, upcast_attention=False,
                    prediction_type="epsilon")
SD2 = TinySDVersion("gelu", "!", linear_projection=True, upcast_attention=True,
                    prediction_type="v_prediction")


@dataclass(frozen=True)
class TinySDSizes:
    """Small enough that a training step on a 2-core CPU takes a fraction of a second."""

    text_dim: int = 32
    text_layers: int = 2
    unet_channels: tuple[int, ...] = (32, 64)
    heads: tuple[int, ...] = (2, 4)
    vae_channels: tuple[int, ...] = (16, 32)  # 2 levels: scale factor 2


def build_tiny_sd(target: Path, version: TinySDVersion = SD1, seed: int = 0,
                  sizes: TinySDSizes = TinySDSizes(), overwrite: bool = False) -> Path:
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        write_clip_tokenizer(tmp / "tokenizer", pad_token=version.pad_token)
        tokenizer = CLIPTokenizer.from_pretrained(tmp / "tokenizer")
        text_encoder = CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=sizes.text_dim,
            intermediate_size=sizes.text_dim * 2, num_hidden_layers=sizes.text_layers,
            num_attention_heads=4, max_position_embeddings=MAX_TOKENS,
            hidden_act=version.hidden_act, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
        n = len(sizes.unet_channels)
        unet = UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4,
            down_block_types=("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1),
            block_out_channels=sizes.unet_channels, layers_per_block=1, norm_num_groups=8,
            attention_head_dim=sizes.heads, cross_attention_dim=sizes.text_dim,
            use_linear_projection=version.linear_projection,
            upcast_attention=version.upcast_attention)
        m = len(sizes.vae_channels)
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * m,
            up_block_types=("UpDecoderBlock2D",) * m, block_out_channels=sizes.vae_channels,
            layers_per_block=1, norm_num_groups=8, sample_size=64, scaling_factor=0.18215)
        betas = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
                 "beta_schedule": "scaled_linear", "steps_offset": 1,
                 "set_alpha_to_one": False, "prediction_type": version.prediction_type}
        scheduler = (PNDMScheduler(skip_prk_steps=True, **betas) if version is SD1
                     else DDIMScheduler(clip_sample=False, **betas))
        StableDiffusionPipeline(
            vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
            scheduler=scheduler, safety_checker=None, feature_extractor=None,
            requires_safety_checker=False,
        ).save_pretrained(tmp)
    return target
