"""Build a tiny random-initialised Lumina-Image 2.0 model folder, with no download.

The layout is the diffusers one (`Lumina2Pipeline.from_pretrained` reads it):

    transformer/   Lumina2Transformer2DModel: hidden 32, grouped heads (4 query, 2
                   key/value, as Lumina 2's 24/8), 1 noise + 1 context refiner, 2 layers
    text_encoder/  Gemma2Model                    tokenizer/  ByT5Tokenizer (right pad)
    vae/           AutoencoderKL, 4 levels (scale factor 8), FLUX.1's shift and scale
    scheduler/     FlowMatchEulerDiscreteScheduler, shift 6 (how ComfyUI samples Lumina 2)
    model_index.json

`Lumina2Sizes.interop()` is the same model at Lumina 2's real attention width (2304
hidden, 24 query and 8 key/value heads of 96): diffusers' converter for the authors'
LoRA layout splits the fused qkv at exactly 2304/768/768 rows. Each part is written by
its own `save_pretrained` under `torch.manual_seed(seed)`; the folder is published by
one rename.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

MODEL_INDEX = {
    "_class_name": "Lumina2Pipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Gemma2Model"],
    "tokenizer": ["transformers", "ByT5Tokenizer"],
    "transformer": ["diffusers", "Lumina2Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}


@dataclass(frozen=True)
class Lumina2Sizes:
    """Tiny by default: a training step on 32-64 px images takes milliseconds."""

    hidden_size: int = 32
    num_attention_heads: int = 4
    num_kv_heads: int = 2
    axes_dim_rope: tuple[int, int, int] = (2, 2, 4)  # sums to the head size
    num_layers: int = 2
    num_refiner_layers: int = 1
    multiple_of: int = 16
    ffn_dim_multiplier: float | None = None
    text_dim: int = 32
    latent_channels: int = 4
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8
    # ByT5 counts bytes: the system prompt and ' <Prompt Start> ' take 176 of these.
    max_text_tokens: int = 256

    @classmethod
    def interop(cls) -> Lumina2Sizes:
        """Lumina 2's attention width (diffusers' qkv split), one layer, a thin MLP."""
        return cls(hidden_size=2304, num_attention_heads=24, num_kv_heads=8,
                   axes_dim_rope=(32, 32, 32), num_layers=1, multiple_of=64,
                   ffn_dim_multiplier=0.01)


def build_tiny_lumina2(target: Path, seed: int = 0, sizes: Lumina2Sizes = Lumina2Sizes(),
                       overwrite: bool = False) -> Path:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, Lumina2Transformer2DModel
    from transformers import ByT5Tokenizer, Gemma2Config, Gemma2Model

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        ByT5Tokenizer(model_max_length=sizes.max_text_tokens).save_pretrained(tmp / "tokenizer")
        Gemma2Model(Gemma2Config(
            vocab_size=384, hidden_size=sizes.text_dim, intermediate_size=sizes.text_dim * 2,
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            max_position_embeddings=512, sliding_window=64, pad_token_id=0,
        )).save_pretrained(tmp / "text_encoder")
        n = len(sizes.vae_channels)
        AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=sizes.latent_channels,
            down_block_types=("DownEncoderBlock2D",) * n,
            up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=sizes.vae_channels,
            layers_per_block=1, norm_num_groups=8, sample_size=64, scaling_factor=0.3611,
            shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
        ).save_pretrained(tmp / "vae")
        Lumina2Transformer2DModel(
            sample_size=16, patch_size=2, in_channels=sizes.latent_channels,
            hidden_size=sizes.hidden_size, num_layers=sizes.num_layers,
            num_refiner_layers=sizes.num_refiner_layers,
            num_attention_heads=sizes.num_attention_heads, num_kv_heads=sizes.num_kv_heads,
            multiple_of=sizes.multiple_of, ffn_dim_multiplier=sizes.ffn_dim_multiplier,
            axes_dim_rope=sizes.axes_dim_rope, cap_feat_dim=sizes.text_dim,
        ).save_pretrained(tmp / "transformer")
        FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=6.0
                                        ).save_pretrained(tmp / "scheduler")
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return target
