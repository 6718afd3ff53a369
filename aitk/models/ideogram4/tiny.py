"""A tiny random-initialised Ideogram 4 model folder, built locally (no download).

The layout is the diffusers one, written by `Ideogram4Pipeline.save_pretrained`
(`model_index.json`, `transformer/ unconditional_transformer/ text_encoder/ tokenizer/
vae/ scheduler/`):

    transformer/               Ideogram4Transformer2DModel: 1 block, 2 heads of 16
    unconditional_transformer/ the same shape, its own random weights (the pipeline's
                               image-only guidance branch)
    text_encoder/              Qwen3VLModel: a Qwen3-VL language model of hidden 16 and
                               36 layers (the pipeline taps fixed layers 0, 3, ..., 35)
                               and a one-block vision tower (the real key layout)
    tokenizer/                 the byte-level Qwen tokenizer of the qwen_image tiny model
                               with a Qwen chat template over the pipeline's messages
    vae/                       klein's tiny AutoencoderKLFlux2 (non-trivial BatchNorm
                               statistics)
    scheduler/                 FlowMatchEulerDiscreteScheduler (the pipeline sets its own
                               logit-normal sigmas; training reads no shift from it)

The modulation and output layers' biases are zero and the time embedding is
near-constant in diffusers' init; the modulations and the output layer get small random
values here, so LoRA gradients are not all zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.flux2_klein.tiny import TinySizes as KleinSizes
from aitk.models.flux2_klein.tiny import tiny_flux2_vae
from aitk.models.qwen_image.tiny import write_tokenizer
from aitk_common.files import staged_dir

# Qwen's chat format for the pipeline's messages (content: a list of {"type": "text"}).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set text = message['content'] if message['content'] is string else "
    "message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') "
    "| join('') %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + text + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)


@dataclass(frozen=True)
class TinySizes:
    text_dim: int = 16
    text_layers: int = 36  # the pipeline's fixed taps go up to layer 35
    heads: int = 2
    head_dim: int = 16
    layers: int = 1
    latent_channels: int = 4
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8


def tiny_ideogram4_transformer(sizes: TinySizes, llm_features_dim: int,
                               seed: int) -> torch.nn.Module:
    from diffusers import Ideogram4Transformer2DModel

    torch.manual_seed(seed)
    transformer = Ideogram4Transformer2DModel(
        in_channels=sizes.latent_channels * 4, num_layers=sizes.layers,
        attention_head_dim=sizes.head_dim, num_attention_heads=sizes.heads,
        intermediate_size=64, adaln_dim=16, llm_features_dim=llm_features_dim,
        rope_theta=10_000, mrope_section=(4, 2, 2))
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "adaln" in name or "final_layer" in name:
                p.normal_(0.0, 0.05)
    return transformer


def build_tiny_ideogram4(target: Path, seed: int = 0, sizes: TinySizes = TinySizes()
                         ) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, Ideogram4Pipeline
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import QWEN3_VL_ACTIVATION_LAYERS
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLModel

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        tokenizer.chat_template = CHAT_TEMPLATE
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
        features = sizes.text_dim * len(QWEN3_VL_ACTIVATION_LAYERS)
        vae = tiny_flux2_vae(KleinSizes(latent_channels=sizes.latent_channels,
                                        vae_channels=sizes.vae_channels))
        Ideogram4Pipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
            text_encoder=text_encoder, tokenizer=tokenizer,
            transformer=tiny_ideogram4_transformer(sizes, features, seed),
            unconditional_transformer=tiny_ideogram4_transformer(sizes, features,
                                                                 seed + 1),
        ).save_pretrained(tmp)
    return target
