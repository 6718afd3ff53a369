"""Build a tiny random-initialised SD3 model folder, with no download.

The layout is the diffusers one (`StableDiffusion3Pipeline.from_pretrained` reads it):

    transformer/     SD3Transformer2DModel: 2 joint blocks, hidden 32, RMS q/k norm as
                     in 3.5, block 0 with the second attention of 3.5 Medium (MMDiT-X)
                     and the last block context-pre-only, as in every release
    text_encoder/    CLIPTextModelWithProjection   tokenizer/    CLIPTokenizer
    text_encoder_2/  CLIPTextModelWithProjection   tokenizer_2/  CLIPTokenizer (pads "!")
    text_encoder_3/  T5EncoderModel                tokenizer_3/  ByT5Tokenizer
    vae/             AutoencoderKL, 4 levels (scale factor 8), SD3's shift and scale
    scheduler/       FlowMatchEulerDiscreteScheduler, shift 3.0 as the releases
    model_index.json

Tokenizers are local: the CLIP ones byte-level (aitk.models.sdxl.tiny), the T5 slot
ByT5 (bytes, no vocabulary file): the transformer only sees the encoders' outputs.
Each part is written by its own `save_pretrained` under `torch.manual_seed(seed)`; the
folder is published by one rename.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

MODEL_INDEX = {
    "_class_name": "StableDiffusion3Pipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_3": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "CLIPTokenizer"],
    "tokenizer_3": ["transformers", "ByT5Tokenizer"],
    "transformer": ["diffusers", "SD3Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "image_encoder": [None, None],
    "feature_extractor": [None, None],
}


@dataclass(frozen=True)
class SD3Sizes:
    """Tiny by default: a training step on 32-64 px images takes milliseconds."""

    num_layers: int = 2
    attention_head_dim: int = 8
    num_attention_heads: int = 4  # hidden 32
    clip_dims: tuple[int, int] = (16, 16)  # CLIP-L, CLIP-G widths (real: 768, 1280)
    t5_dim: int = 32  # >= the CLIPs' sum: their states are zero-padded to it
    latent_channels: int = 4  # real: 16
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8
    dual_attention_layers: tuple[int, ...] = (0,)  # 3.5 Medium: 0..12; Large: none
    max_t5_tokens: int = 32


def _write_clips(tmp: Path, sizes: SD3Sizes) -> None:
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    from aitk.models.sdxl.tiny import EOS, write_clip_tokenizer

    for index, (sub, pad) in enumerate((("", EOS), ("_2", "!"))):
        write_clip_tokenizer(tmp / f"tokenizer{sub}", pad_token=pad)
        tokenizer = CLIPTokenizer.from_pretrained(tmp / f"tokenizer{sub}")
        dim = sizes.clip_dims[index]
        CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=dim, intermediate_size=dim * 2,
            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
            projection_dim=dim, hidden_act="gelu", bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )).save_pretrained(tmp / f"text_encoder{sub}")


def _write_t5(tmp: Path, sizes: SD3Sizes) -> None:
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    T5EncoderModel(T5Config(
        vocab_size=384, d_model=sizes.t5_dim, d_kv=sizes.t5_dim // 4, d_ff=sizes.t5_dim * 2,
        num_layers=1, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=32, dropout_rate=0.0, feed_forward_proj="gated-gelu",
        is_encoder_decoder=False, use_cache=False)).save_pretrained(tmp / "text_encoder_3")
    ByT5Tokenizer(model_max_length=sizes.max_t5_tokens).save_pretrained(tmp / "tokenizer_3")


def build_tiny_sd3(target: Path, seed: int = 0, sizes: SD3Sizes = SD3Sizes(),
                   overwrite: bool = False) -> Path:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        _write_clips(tmp, sizes)
        _write_t5(tmp, sizes)
        n = len(sizes.vae_channels)
        AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=sizes.latent_channels,
            down_block_types=("DownEncoderBlock2D",) * n,
            up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=sizes.vae_channels,
            layers_per_block=1, norm_num_groups=8, sample_size=64,
            scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
            use_post_quant_conv=False,
        ).save_pretrained(tmp / "vae")
        SD3Transformer2DModel(
            sample_size=32, patch_size=2, in_channels=sizes.latent_channels,
            num_layers=sizes.num_layers, attention_head_dim=sizes.attention_head_dim,
            num_attention_heads=sizes.num_attention_heads, joint_attention_dim=sizes.t5_dim,
            caption_projection_dim=sizes.attention_head_dim * sizes.num_attention_heads,
            pooled_projection_dim=sum(sizes.clip_dims), out_channels=sizes.latent_channels,
            pos_embed_max_size=32, dual_attention_layers=sizes.dual_attention_layers,
            qk_norm="rms_norm",
        ).save_pretrained(tmp / "transformer")
        FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0
                                        ).save_pretrained(tmp / "scheduler")
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return target
