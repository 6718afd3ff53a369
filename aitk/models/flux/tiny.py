"""Build a tiny random-initialised Flux model folder, with no download.

The layout is the diffusers one (`FluxPipeline.from_pretrained` reads it too):

    transformer/    FluxTransformer2DModel (1 double + 1 single block, hidden 32,
                    guidance embedding on, as in FLUX.1 dev)
    text_encoder/   CLIPTextModel (pooled output)   tokenizer/    CLIPTokenizer
    text_encoder_2/ T5EncoderModel                  tokenizer_2/  ByT5Tokenizer
    vae/            AutoencoderKL, 4 levels (scale factor 8, as Flux), 4 latent channels
    scheduler/      FlowMatchEulerDiscreteScheduler with FLUX.1 dev's dynamic shift
    model_index.json   so FluxPipeline.from_pretrained(folder) loads it whole

Tokenizers are built locally: the CLIP one from a byte-level vocabulary written here
(every byte as a token, no merges), the T5 slot takes ByT5 (bytes, no vocabulary file);
the Flux transformer only sees the encoders' outputs, so any tokenizer fits the tiny
model. Each part is written with its own `save_pretrained` under
`torch.manual_seed(seed)`; the folder is published by one rename.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

# What `FluxPipeline.from_pretrained(folder)` reads to know each part's class.
MODEL_INDEX = {
    "_class_name": "FluxPipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "text_encoder_2": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "ByT5Tokenizer"],
    "transformer": ["diffusers", "FluxTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "image_encoder": [None, None],
    "feature_extractor": [None, None],
}


@dataclass(frozen=True)
class FluxSizes:
    """Tiny by default: a training step on 32-64 px images takes milliseconds."""

    num_layers: int = 1
    num_single_layers: int = 1
    attention_head_dim: int = 16
    num_attention_heads: int = 2
    axes_dims_rope: tuple[int, int, int] = (4, 6, 6)  # sums to attention_head_dim
    text_dim: int = 32
    text_layers: int = 1
    clip_dim: int = 32
    latent_channels: int = 4
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8
    max_sequence_length: int = 32  # T5 tokens; FLUX.1 uses 512 (dev) / 256 (schnell)
    guidance_embeds: bool = True  # dev: True; schnell: False


def clip_byte_tokenizer(folder: Path, max_length: int = 77):
    """A CLIPTokenizer whose vocabulary is the 256 byte symbols (plain and word-final)."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"),
                         model_max_length=max_length)


def write_tiny_t5(model_dir: Path, tokenizer_dir: Path, sizes: FluxSizes) -> None:
    """A T5 encoder of `sizes.text_dim` and a ByT5 tokenizer (bytes: no vocabulary file)."""
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    T5EncoderModel(T5Config(
        vocab_size=384, d_model=sizes.text_dim, d_kv=sizes.text_dim // 4,
        d_ff=sizes.text_dim * 2, num_layers=sizes.text_layers, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32,
        dropout_rate=0.0, feed_forward_proj="gated-gelu", is_encoder_decoder=False,
        use_cache=False)).save_pretrained(model_dir)
    ByT5Tokenizer(model_max_length=sizes.max_sequence_length).save_pretrained(tokenizer_dir)


def write_tiny_vae(folder: Path, sizes: FluxSizes) -> None:
    """Flux's AutoencoderKL shape (shift and scale factors) at tiny width."""
    from diffusers import AutoencoderKL

    n = len(sizes.vae_channels)
    AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=sizes.latent_channels,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=sizes.vae_channels, layers_per_block=1, norm_num_groups=8,
        sample_size=64, scaling_factor=0.3611, shift_factor=0.1159,
        use_quant_conv=False, use_post_quant_conv=False,
    ).save_pretrained(folder)


def build_tiny_flux(target: Path, seed: int = 0, sizes: FluxSizes = FluxSizes(),
                    overwrite: bool = False, pipeline_class: str = "FluxPipeline") -> Path:
    """`pipeline_class` names the model_index's pipeline (FluxKontextPipeline reuses the
    same parts)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        tokenizer = clip_byte_tokenizer(tmp / "_clip_vocab")
        tokenizer.save_pretrained(tmp / "tokenizer")
        for name in ("vocab.json", "merges.txt"):
            (tmp / "_clip_vocab" / name).unlink()
        (tmp / "_clip_vocab").rmdir()
        CLIPTextModel(CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=sizes.clip_dim,
            intermediate_size=sizes.clip_dim * 2, num_hidden_layers=sizes.text_layers,
            num_attention_heads=2, max_position_embeddings=77,
            projection_dim=sizes.clip_dim, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )).save_pretrained(tmp / "text_encoder")

        write_tiny_t5(tmp / "text_encoder_2", tmp / "tokenizer_2", sizes)
        write_tiny_vae(tmp / "vae", sizes)

        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=sizes.latent_channels * 4,
            num_layers=sizes.num_layers, num_single_layers=sizes.num_single_layers,
            attention_head_dim=sizes.attention_head_dim,
            num_attention_heads=sizes.num_attention_heads,
            joint_attention_dim=sizes.text_dim, pooled_projection_dim=sizes.clip_dim,
            guidance_embeds=sizes.guidance_embeds, axes_dims_rope=sizes.axes_dims_rope)
        transformer.save_pretrained(tmp / "transformer")

        FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
            base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096,
        ).save_pretrained(tmp / "scheduler")
        (tmp / "model_index.json").write_text(json.dumps(
            {**MODEL_INDEX, "_class_name": pipeline_class}, indent=2))
    return target
