"""Build a tiny random-initialised SDXL model folder, with no download.

The layout is the hub's (`model_index.json`, `unet/`, `vae/`, `text_encoder/`,
`text_encoder_2/`, `tokenizer/`, `tokenizer_2/`, `scheduler/`), written by
`StableDiffusionXLPipeline.save_pretrained` (each part's own `save_pretrained`), so the
folder loads both through `SDXLModel.load_model` and diffusers' own
`StableDiffusionXLPipeline.from_pretrained`. The shapes keep SDXL's structure at toy
sizes: two CLIP encoders whose penultimate states concatenate to the UNet's
cross-attention width, encoder 2's projection as the pooled embedding, `text_time`
added conditioning, linear transformer projections, SDXL's betas and VAE scale.

Tokenizers: a tiny byte-level CLIP BPE vocabulary (the 256 byte symbols, each also as a
word end, a few merges, the two special tokens) written here as `vocab.json` +
`merges.txt`; real CLIP tokenization rules, nothing downloaded.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
MAX_TOKENS = 77  # CLIP's context, as in SDXL
MERGES = ("t h", "th e</w>", "i n", "e r", "o n", "r e", "a n", "an d</w>")


@dataclass(frozen=True)
class TinySDXLSizes:
    """Small enough that a training step on a 2-core CPU takes a fraction of a second."""

    text_dims: tuple[int, int] = (32, 32)  # encoder 1, encoder 2 -> cross_attention 64
    text_layers: int = 2  # the penultimate layer is what SDXL reads
    projection_dim: int = 32  # encoder 2's pooled embedding
    unet_channels: tuple[int, ...] = (32, 64)
    head_dims: tuple[int, ...] = (2, 4)
    time_embed_dim: int = 8  # per time id; 6 ids
    vae_channels: tuple[int, ...] = (16, 32)  # 2 levels: scale factor 2


def clip_vocab() -> tuple[dict[str, int], list[str]]:
    """A byte-level CLIP vocabulary: every byte symbol, alone and as a word end, the
    merges' results, then the special tokens (last, as in CLIP's own vocabulary)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols]
    tokens += ["".join(m.split()) for m in MERGES]
    tokens += [BOS, EOS]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}, list(MERGES)


def write_clip_tokenizer(target: Path, pad_token: str) -> None:
    """vocab.json + merges.txt written here, loaded as a CLIPTokenizer and saved in full
    (tokenizer.json and config) by its own save_pretrained."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        (src / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        (src / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n",
                                        encoding="utf-8")
        tokenizer = CLIPTokenizer.from_pretrained(src, pad_token=pad_token,
                                                  model_max_length=MAX_TOKENS)
        tokenizer.save_pretrained(target)


def build_tiny_sdxl(target: Path, seed: int = 0, sizes: TinySDXLSizes = TinySDXLSizes(),
                    prediction_type: str = "epsilon", overwrite: bool = False) -> Path:
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        CLIPTokenizer,
    )

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        write_clip_tokenizer(tmp / "tokenizer", pad_token=EOS)
        write_clip_tokenizer(tmp / "tokenizer_2", pad_token="!")  # SDXL's second pads "!"
        tokenizer = CLIPTokenizer.from_pretrained(tmp / "tokenizer")
        tokenizer_2 = CLIPTokenizer.from_pretrained(tmp / "tokenizer_2")
        vocab_size = len(tokenizer)

        def text_config(dim: int) -> CLIPTextConfig:
            return CLIPTextConfig(
                vocab_size=vocab_size, hidden_size=dim, intermediate_size=dim * 2,
                num_hidden_layers=sizes.text_layers, num_attention_heads=4,
                max_position_embeddings=MAX_TOKENS, projection_dim=sizes.projection_dim,
                hidden_act="gelu", bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)

        text_encoder = CLIPTextModel(text_config(sizes.text_dims[0]))
        text_encoder_2 = CLIPTextModelWithProjection(text_config(sizes.text_dims[1]))

        n = len(sizes.unet_channels)
        unet = UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (n - 1),
            up_block_types=("CrossAttnUpBlock2D",) * (n - 1) + ("UpBlock2D",),
            block_out_channels=sizes.unet_channels, layers_per_block=1, norm_num_groups=8,
            attention_head_dim=sizes.head_dims, cross_attention_dim=sum(sizes.text_dims),
            use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=sizes.time_embed_dim,
            projection_class_embeddings_input_dim=(6 * sizes.time_embed_dim
                                                   + sizes.projection_dim))
        m = len(sizes.vae_channels)
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * m,
            up_block_types=("UpDecoderBlock2D",) * m, block_out_channels=sizes.vae_channels,
            layers_per_block=1, norm_num_groups=8, sample_size=64,
            scaling_factor=0.13025, force_upcast=True)  # SDXL's VAE scale, no shift
        # SDXL's training betas and Euler sampler settings.
        scheduler = EulerDiscreteScheduler(
            num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
            beta_schedule="scaled_linear", prediction_type=prediction_type,
            timestep_spacing="leading", steps_offset=1)
        StableDiffusionXLPipeline(
            vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
            tokenizer=tokenizer, tokenizer_2=tokenizer_2, unet=unet, scheduler=scheduler,
            add_watermarker=False,
        ).save_pretrained(tmp)
    return target
