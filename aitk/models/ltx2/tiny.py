"""Build a tiny random-initialised LTX-2 folder (no download), in the diffusers layout
`LTX2Pipeline.from_pretrained(folder)` reads:

    transformer/   LTX2VideoTransformer3DModel: 1 block of the video stream (2 heads of 8)
                   and the audio stream (2 heads of 4) with their cross-modal attention
    vae/           AutoencoderKLLTX2Video: LTX-2's block layout at 8-64 channels, 32x
                   space and 8x time (frames 8k + 1), 8 latent channels
    audio_vae/     AutoencoderKLLTX2Audio: 16 mel bins -> 2 latent channels x 4 bins
    vocoder/       LTX2Vocoder: mel -> stereo waveform at 16 kHz (previews' soundtrack)
    connectors/    LTX2TextConnectors: stacked Gemma states -> video / audio text tokens
    text_encoder/  Gemma3ForConditionalGeneration: 1 text layer of 16 (so 2 stacked hidden
                   states), a 1-layer vision tower as the real one has a vision tower
    tokenizer/     GemmaTokenizerFast over a small character vocabulary built here
    scheduler/     FlowMatchEulerDiscreteScheduler with LTX-2's dynamic shift
    model_index.json

Each part is written with its own `save_pretrained` under `torch.manual_seed(seed)`; the
folder is published by one rename.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

TEXT_LEN = 1024  # LTX-2's prompt length: the connectors' registers fill the padding


@dataclass(frozen=True)
class LtxSizes:
    text_dim: int = 16  # Gemma hidden size; the connectors' and transformer's caption width
    text_layers: int = 1  # stacked hidden states = layers + 1 (the embeddings)
    video_heads: int = 2
    video_head_dim: int = 8
    audio_heads: int = 2
    audio_head_dim: int = 4
    latent_channels: int = 8
    mel_bins: int = 16
    audio_latent_channels: int = 2
    registers: int = 8  # TEXT_LEN must be a multiple


MODEL_INDEX = {
    "_class_name": "LTX2Pipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "vae": ["diffusers", "AutoencoderKLLTX2Video"],
    "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
    "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
    "tokenizer": ["transformers", "GemmaTokenizerFast"],
    "connectors": ["ltx2", "LTX2TextConnectors"],
    "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
    "vocoder": ["ltx2", "LTX2Vocoder"],
}


def tiny_vocab() -> dict[str, int]:
    """Gemma's special tokens, then one token per printable character (space as `▁`)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    for ch in string.ascii_letters + string.digits + string.punctuation + " ":
        vocab.setdefault("▁" if ch == " " else ch, len(vocab))
    return vocab


def save_tokenizer(folder: Path) -> int:
    from transformers import GemmaTokenizerFast

    vocab = tiny_vocab()
    GemmaTokenizerFast(vocab=vocab, merges=[], add_bos_token=True,  # as Gemma's: <bos> first
                       model_max_length=TEXT_LEN).save_pretrained(folder)
    return len(vocab)


def tiny_text_encoder(sizes: LtxSizes, vocab_size: int):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    return Gemma3ForConditionalGeneration(Gemma3Config(
        text_config={"vocab_size": vocab_size + 8, "hidden_size": sizes.text_dim,
                     "intermediate_size": sizes.text_dim * 2,
                     "num_hidden_layers": sizes.text_layers, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 8,
                     "max_position_embeddings": TEXT_LEN * 2, "sliding_window": 64},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4))


def tiny_transformer(sizes: LtxSizes):
    from diffusers import LTX2VideoTransformer3DModel

    audio_channels = sizes.audio_latent_channels * (sizes.mel_bins // 4)
    model = LTX2VideoTransformer3DModel(
        in_channels=sizes.latent_channels, out_channels=sizes.latent_channels,
        num_attention_heads=sizes.video_heads, attention_head_dim=sizes.video_head_dim,
        cross_attention_dim=sizes.video_heads * sizes.video_head_dim,
        audio_in_channels=audio_channels, audio_out_channels=audio_channels,
        audio_num_attention_heads=sizes.audio_heads,
        audio_attention_head_dim=sizes.audio_head_dim,
        audio_cross_attention_dim=sizes.audio_heads * sizes.audio_head_dim,
        num_layers=1, caption_channels=sizes.text_dim, rope_type="split")
    with torch.no_grad():
        # adaLN-single's last Linear and the output heads start near zero in a random
        # init: wake them so a LoRA's gradients and a preview's frames are not flat.
        for head in (model.proj_out, model.audio_proj_out):
            head.weight.normal_(0.0, 0.2)
        model.scale_shift_table.normal_(0.0, 0.2)
    return model


def tiny_video_vae(sizes: LtxSizes):
    from diffusers import AutoencoderKLLTX2Video

    # LTX-2's own block layout (4 down blocks: spatial, temporal, 2x spatiotemporal; 3 up
    # blocks; patch 4) at toy widths: 32x space, 8x time as the real VAE. The decoder pads
    # with zeros, not the real one's reflection, which cannot pad a 1-cell latent: the
    # shared arch checks decode clips one size multiple (32 px) wide.
    return AutoencoderKLLTX2Video(
        latent_channels=sizes.latent_channels, block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1), decoder_causal=False,
        decoder_spatial_padding_mode="zeros", spatial_compression_ratio=32,
        temporal_compression_ratio=8)


def build_tiny_ltx2(target: Path, seed: int = 0, sizes: LtxSizes = LtxSizes(),
                    overwrite: bool = False) -> Path:
    from diffusers import AutoencoderKLLTX2Audio, FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        vocab_size = save_tokenizer(tmp / "tokenizer")
        tiny_text_encoder(sizes, vocab_size).save_pretrained(tmp / "text_encoder")
        LTX2TextConnectors(
            caption_channels=sizes.text_dim, text_proj_in_factor=sizes.text_layers + 1,
            video_connector_num_attention_heads=2,
            video_connector_attention_head_dim=sizes.text_dim // 2,
            video_connector_num_layers=1, video_connector_num_learnable_registers=sizes.registers,
            audio_connector_num_attention_heads=2,
            audio_connector_attention_head_dim=sizes.text_dim // 2,
            audio_connector_num_layers=1, audio_connector_num_learnable_registers=sizes.registers,
            rope_type="split").save_pretrained(tmp / "connectors")
        tiny_transformer(sizes).save_pretrained(tmp / "transformer")
        tiny_video_vae(sizes).save_pretrained(tmp / "vae")
        AutoencoderKLLTX2Audio(base_channels=8, ch_mult=(1, 2, 4), num_res_blocks=1,
                               latent_channels=sizes.audio_latent_channels,
                               mel_bins=sizes.mel_bins).save_pretrained(tmp / "audio_vae")
        # Upsampling 8 x 20 = the audio VAE's hop (160): a preview's soundtrack lasts
        # as long as its clip, as the real vocoder's does.
        LTX2Vocoder(in_channels=2 * sizes.mel_bins, hidden_channels=8, out_channels=2,
                    upsample_kernel_sizes=[16, 40], upsample_factors=[8, 20],
                    resnet_kernel_sizes=[3], resnet_dilations=[[1]],
                    output_sampling_rate=16000).save_pretrained(tmp / "vocoder")
        # LTX-2's scheduler config (dynamic exponential shift over the video tokens).
        FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.95,
            max_shift=2.05, base_image_seq_len=1024, max_image_seq_len=4096,
            shift_terminal=0.1, time_shift_type="exponential").save_pretrained(tmp / "scheduler")
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return target
