"""Build tiny random-initialised Wan model folders (2.1 and 2.2, t2v and i2v), no download.

The layout is the diffusers one, so `WanPipeline.from_pretrained(folder)` (or
`WanImageToVideoPipeline`) reads the same folder the trainer loads:

    transformer/     WanTransformer3DModel (1 block, 2 heads of 16, patch (1, 2, 2))
    transformer_2/   (Wan 2.2 14B only) the low-noise expert, same shape, other weights
    vae/             AutoencoderKLWan (base_dim 8, z_dim 4; 8x space, 4x time as Wan)
    text_encoder/    UMT5EncoderModel (1 layer, d_model 32)
    tokenizer/       ByT5Tokenizer (bytes, no vocabulary file: built locally)
    scheduler/       UniPCMultistepScheduler, flow prediction with flow_shift 3.0, as
                     the Wan-AI diffusers repos ship it
    image_encoder/   (Wan 2.1 i2v only) CLIPVisionModel, 2 layers of 32, 32 px input
    image_processor/ (Wan 2.1 i2v only) CLIPImageProcessor resizing to 32 px
    model_index.json

The tokenizer slot takes ByT5, as the tiny Flux model's T5 slot does
(aitk.models.flux.tiny): the transformer only sees the encoder's outputs, so any
tokenizer fits a random model. Each part is written with its own `save_pretrained`
under `torch.manual_seed(seed)`; the folder is published by one rename.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

# Wan's T5 context length: prompts are zero-padded to it (WanPipeline does the same).
TEXT_LEN = 512


@dataclass(frozen=True)
class WanSizes:
    """Tiny by default: a training step on 5 frames of 32x32 takes well under a second."""

    num_layers: int = 1
    num_attention_heads: int = 2
    attention_head_dim: int = 16
    ffn_dim: int = 64
    freq_dim: int = 32
    text_dim: int = 32
    text_layers: int = 1
    z_dim: int = 4
    vae_base_dim: int = 8
    clip_dim: int = 32


@dataclass(frozen=True)
class WanVariant:
    """Which Wan: i2v adds first-frame condition channels (4 mask + z_dim latent);
    `clip` adds the CLIP image encoder (2.1 i2v); `experts` = 2 writes transformer_2
    (2.2 14B) with the pipeline's `boundary_ratio`."""

    i2v: bool = False
    clip: bool = False
    experts: int = 1
    boundary_ratio: float | None = None


WAN21 = WanVariant()
WAN21_I2V = WanVariant(i2v=True, clip=True)
WAN22_14B = WanVariant(experts=2, boundary_ratio=0.875)
WAN22_14B_I2V = WanVariant(i2v=True, experts=2, boundary_ratio=0.9)


def model_index(variant: WanVariant) -> dict:
    """What `WanPipeline` / `WanImageToVideoPipeline.from_pretrained(folder)` read."""
    index = {
        "_class_name": "WanImageToVideoPipeline" if variant.i2v else "WanPipeline",
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "ByT5Tokenizer"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": (["diffusers", "WanTransformer3DModel"] if variant.experts == 2
                          else [None, None]),
        "vae": ["diffusers", "AutoencoderKLWan"],
        "boundary_ratio": variant.boundary_ratio,
        "expand_timesteps": False,
    }
    if variant.i2v:
        clip = variant.clip
        index["image_encoder"] = ["transformers", "CLIPVisionModel"] if clip else [None, None]
        index["image_processor"] = (["transformers", "CLIPImageProcessor"] if clip
                                    else [None, None])
    return index


def tiny_transformer(sizes: WanSizes, variant: WanVariant):
    from diffusers import WanTransformer3DModel

    inner = sizes.num_attention_heads * sizes.attention_head_dim
    # i2v input: noisy latents + 4 first-frame mask channels + the condition latents.
    in_channels = sizes.z_dim * 2 + 4 if variant.i2v else sizes.z_dim
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=sizes.num_attention_heads,
        attention_head_dim=sizes.attention_head_dim, in_channels=in_channels,
        out_channels=sizes.z_dim, text_dim=sizes.text_dim, freq_dim=sizes.freq_dim,
        ffn_dim=sizes.ffn_dim, num_layers=sizes.num_layers, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6,
        image_dim=sizes.clip_dim if variant.clip else None,
        added_kv_proj_dim=inner if variant.clip else None, rope_max_seq_len=1024)
    with torch.no_grad():  # random init leaves the output projection tiny: wake it up
        model.proj_out.weight.normal_(0.0, 0.2)
    return model


def build_tiny_wan(target: Path, variant: WanVariant = WAN21, seed: int = 0,
                   sizes: WanSizes = WanSizes(), overwrite: bool = False) -> Path:
    from diffusers import AutoencoderKLWan

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        save_tiny_text_encoder(tmp, sizes)
        AutoencoderKLWan(
            base_dim=sizes.vae_base_dim, z_dim=sizes.z_dim, dim_mult=[1, 2, 2, 2],
            num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[0.1, -0.2, 0.05, 0.3][:sizes.z_dim],
            latents_std=[1.5, 0.8, 1.2, 2.0][:sizes.z_dim],
        ).save_pretrained(tmp / "vae")
        tiny_transformer(sizes, variant).save_pretrained(tmp / "transformer")
        if variant.experts == 2:
            tiny_transformer(sizes, variant).save_pretrained(tmp / "transformer_2")
        if variant.clip:
            from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

            CLIPVisionModel(CLIPVisionConfig(
                hidden_size=sizes.clip_dim, intermediate_size=sizes.clip_dim * 2,
                num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=16,
                projection_dim=sizes.clip_dim)).save_pretrained(tmp / "image_encoder")
            CLIPImageProcessor(size={"shortest_edge": 32},
                               crop_size={"height": 32, "width": 32}
                               ).save_pretrained(tmp / "image_processor")
        save_scheduler(tmp, flow_shift=3.0)
        (tmp / "model_index.json").write_text(json.dumps(model_index(variant), indent=2))
    return target


# ---- the parts every Wan folder shares (Wan 2.2 5B's tiny builder calls these too) -------
def save_tiny_text_encoder(folder: Path, sizes: WanSizes) -> None:
    """tokenizer/ (ByT5) and text_encoder/ (a 1-layer UMT5) under `folder`."""
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    ByT5Tokenizer(model_max_length=TEXT_LEN).save_pretrained(folder / "tokenizer")
    UMT5EncoderModel(UMT5Config(
        vocab_size=384, d_model=sizes.text_dim, d_kv=sizes.text_dim // 4,
        d_ff=sizes.text_dim * 2, num_layers=sizes.text_layers, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32,
        dropout_rate=0.0, feed_forward_proj="gated-gelu", is_encoder_decoder=False,
        use_cache=False)).save_pretrained(folder / "text_encoder")


def save_scheduler(folder: Path, flow_shift: float) -> None:
    """scheduler/: UniPC with flow sigmas, as the Wan-AI diffusers repos ship it."""
    from diffusers import UniPCMultistepScheduler

    UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
        flow_shift=flow_shift, solver_order=2, predict_x0=True, solver_type="bh2",
        lower_order_final=True, final_sigmas_type="zero",
    ).save_pretrained(folder / "scheduler")
