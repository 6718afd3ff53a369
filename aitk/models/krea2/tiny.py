"""A tiny random-initialised Krea 2 model folder, built locally (no download).

The layout is the diffusers one, written by `Krea2Pipeline.save_pretrained`
(`model_index.json`, `transformer/ text_encoder/ tokenizer/ vae/ scheduler/`):

    transformer/   Krea2Transformer2DModel: 1 block, 2 heads of 16 (1 key/value head),
                   a text fusion of 1 layer-wise and 1 refiner block over 3 tapped layers
    text_encoder/  Qwen3VLModel: a Qwen3-VL language model of hidden 32 and 4 layers (the
                   pipeline config taps hidden states 1, 2, 3) and a one-block vision
                   tower, so the checkpoint has the real one's key layout
    tokenizer/     the byte-level Qwen tokenizer of the qwen_image tiny model
    vae/           AutoencoderKLQwenImage at tiny width, non-trivial latent mean and std
    scheduler/     Krea 2's FlowMatchEulerDiscreteScheduler (exponential dynamic shift,
                   mu over 256..6400 image tokens)

The blocks' modulation tables and the output layer start at zero in diffusers; they get
small random values here, so LoRA gradients are not all zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.qwen_image.tiny import write_tokenizer
from aitk_common.files import staged_dir

SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                 base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                 max_image_seq_len=6400, time_shift_type="exponential")


@dataclass(frozen=True)
class TinySizes:
    text_dim: int = 32
    text_layers: int = 4
    select_layers: tuple[int, ...] = (1, 2, 3)
    heads: int = 2
    head_dim: int = 16  # rope axes (4, 6, 6) sum to it
    layers: int = 1
    z_dim: int = 4


def build_tiny_krea2(target: Path, seed: int = 0, sizes: TinySizes = TinySizes(),
                     is_distilled: bool = False) -> Path:
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        Krea2Pipeline,
        Krea2Transformer2DModel,
    )
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLModel

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        eos = tokenizer.eos_token_id
        torch.manual_seed(seed)
        half = sizes.text_dim // 2 // 2  # rotary pairs of one head
        sections = [half // 2, half // 4, half - half // 2 - half // 4]  # t, h, w
        text_encoder = Qwen3VLModel(Qwen3VLConfig(
            text_config=dict(
                vocab_size=len(tokenizer), hidden_size=sizes.text_dim,
                intermediate_size=sizes.text_dim * 2, num_hidden_layers=sizes.text_layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=sizes.text_dim // 2,
                max_position_embeddings=1024, bos_token_id=eos, eos_token_id=eos,
                pad_token_id=eos,
                rope_scaling={"rope_type": "default", "mrope_interleaved": True,
                              "mrope_section": sections}),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                               out_hidden_size=sizes.text_dim, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2,
                               deepstack_visual_indexes=[0])))
        vae = AutoencoderKLQwenImage(base_dim=8, z_dim=sizes.z_dim, dim_mult=[1, 2, 2, 2],
                                     num_res_blocks=1,
                                     latents_mean=[0.1, -0.2, 0.3, 0.0][: sizes.z_dim],
                                     latents_std=[1.5, 2.0, 1.2, 0.8][: sizes.z_dim])
        transformer = Krea2Transformer2DModel(
            in_channels=sizes.z_dim * 4, num_layers=sizes.layers,
            attention_head_dim=sizes.head_dim, num_attention_heads=sizes.heads,
            num_key_value_heads=1, intermediate_size=64, timestep_embed_dim=32,
            text_hidden_dim=sizes.text_dim, num_text_layers=len(sizes.select_layers),
            text_num_attention_heads=2, text_num_key_value_heads=2,
            text_intermediate_size=64, num_layerwise_text_blocks=1,
            num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6))
        with torch.no_grad():
            for name, p in transformer.named_parameters():
                if "scale_shift_table" in name or "final_layer" in name:
                    p.normal_(0.0, 0.05)
        Krea2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
                      text_encoder=text_encoder, tokenizer=tokenizer,
                      transformer=transformer,
                      text_encoder_select_layers=sizes.select_layers,
                      is_distilled=is_distilled).save_pretrained(tmp)
    return target
