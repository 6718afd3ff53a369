"""Build a tiny random-initialised HiDream-I1 model folder, with no download.

The layout is the diffusers one (`HiDreamImagePipeline.from_pretrained` reads it), plus
the Llama the real repos leave to a separate download:

    transformer/     HiDreamImageTransformer2DModel: 1 double + 1 single block, hidden
                     16, 4 routed experts (2 active) + a shared one, as the release
    text_encoder/    CLIPTextModelWithProjection (128 positions: HiDream's CLIPs take
    text_encoder_2/  CLIPTextModelWithProjection  long prompts)   tokenizer(_2)/ CLIP
    text_encoder_3/  T5EncoderModel                tokenizer_3/  ByT5Tokenizer
    text_encoder_4/  LlamaForCausalLM (2 layers)   tokenizer_4/  ByT5Tokenizer
    vae/             AutoencoderKL, 4 levels (scale factor 8), FLUX.1's shift and scale
    scheduler/       FlowMatchEulerDiscreteScheduler, shift 3.0 (upstream's training shift)
    model_index.json

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
    "_class_name": "HiDreamImagePipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_3": ["transformers", "T5EncoderModel"],
    "text_encoder_4": ["transformers", "LlamaForCausalLM"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "CLIPTokenizer"],
    "tokenizer_3": ["transformers", "ByT5Tokenizer"],
    "tokenizer_4": ["transformers", "ByT5Tokenizer"],
    "transformer": ["diffusers", "HiDreamImageTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}


@dataclass(frozen=True)
class HiDreamSizes:
    """Tiny by default: a training step on 32-64 px images takes a fraction of a second."""

    attention_head_dim: int = 8
    num_attention_heads: int = 2  # hidden 16
    axes_dims_rope: tuple[int, int, int] = (4, 2, 2)  # sums to the head size
    clip_dims: tuple[int, int] = (16, 16)  # real: 768, 1280 (pooled: text_emb_dim)
    t5_dim: int = 32  # real 4096
    llama_dim: int = 32  # real 4096
    llama_layers: int = 2  # real 32; the transformer reads layer k for block k
    latent_channels: int = 4  # real 16
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8
    text_tokens: int = 128


def _write_text_encoders(tmp: Path, sizes: HiDreamSizes) -> None:
    from transformers import (
        ByT5Tokenizer,
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        CLIPTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        T5Config,
        T5EncoderModel,
    )

    from aitk.models.sdxl.tiny import EOS, write_clip_tokenizer

    for index, (sub, pad) in enumerate((("", EOS), ("_2", "!"))):
        write_clip_tokenizer(tmp / f"tokenizer{sub}", pad_token=pad)
        tokenizer = CLIPTokenizer.from_pretrained(tmp / f"tokenizer{sub}")
        dim = sizes.clip_dims[index]
        CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=dim, intermediate_size=dim * 2,
            num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=sizes.text_tokens, projection_dim=dim, hidden_act="gelu",
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )).save_pretrained(tmp / f"text_encoder{sub}")
    T5EncoderModel(T5Config(
        vocab_size=384, d_model=sizes.t5_dim, d_kv=sizes.t5_dim // 4, d_ff=sizes.t5_dim * 2,
        num_layers=1, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=32, dropout_rate=0.0, feed_forward_proj="gated-gelu",
        is_encoder_decoder=False, use_cache=False)).save_pretrained(tmp / "text_encoder_3")
    # Saved as the causal LM the real Llama repos hold; aitk loads its base LlamaModel.
    LlamaForCausalLM(LlamaConfig(
        vocab_size=384, hidden_size=sizes.llama_dim, intermediate_size=sizes.llama_dim * 2,
        num_hidden_layers=sizes.llama_layers, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=sizes.text_tokens * 2, pad_token_id=0,
    )).save_pretrained(tmp / "text_encoder_4")
    for sub in ("tokenizer_3", "tokenizer_4"):
        ByT5Tokenizer(model_max_length=sizes.text_tokens).save_pretrained(tmp / sub)


def build_tiny_hidream(target: Path, seed: int = 0, sizes: HiDreamSizes = HiDreamSizes(),
                       overwrite: bool = False) -> Path:
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        HiDreamImageTransformer2DModel,
    )

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        _write_text_encoders(tmp, sizes)
        n = len(sizes.vae_channels)
        AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=sizes.latent_channels,
            down_block_types=("DownEncoderBlock2D",) * n,
            up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=sizes.vae_channels,
            layers_per_block=1, norm_num_groups=8, sample_size=64, scaling_factor=0.3611,
            shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
        ).save_pretrained(tmp / "vae")
        HiDreamImageTransformer2DModel(
            patch_size=2, in_channels=sizes.latent_channels,
            out_channels=sizes.latent_channels, num_layers=1, num_single_layers=1,
            attention_head_dim=sizes.attention_head_dim,
            num_attention_heads=sizes.num_attention_heads,
            caption_channels=[sizes.t5_dim, sizes.llama_dim],
            text_emb_dim=sum(sizes.clip_dims), num_routed_experts=4, num_activated_experts=2,
            axes_dims_rope=sizes.axes_dims_rope, max_resolution=(16, 16),
            llama_layers=[0, sizes.llama_layers - 1],
        ).save_pretrained(tmp / "transformer")
        FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0
                                        ).save_pretrained(tmp / "scheduler")
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return target
