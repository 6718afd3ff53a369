"""A tiny random-initialised FLUX.2 [dev] model folder, built locally (no download).

The layout is the diffusers one, written by `Flux2Pipeline.save_pretrained`
(`model_index.json`, `transformer/ vae/ text_encoder/ tokenizer/ scheduler/`), so the
folder loads through the same `from_pretrained` calls as black-forest-labs/FLUX.2-dev:

    transformer/   klein's tiny Flux2Transformer2DModel with the guidance embedding on
    vae/           klein's tiny AutoencoderKLFlux2 (non-trivial BatchNorm statistics)
    text_encoder/  Mistral3ForConditionalGeneration: a Mistral of hidden 32 and 31 layers
                   (the pipeline reads hidden states 10, 20, 30) and a one-layer Pixtral
                   vision tower, so the checkpoint has the real one's key layout
    tokenizer/     the byte-level Qwen tokenizer of the qwen_image tiny model with a
                   Mistral-style chat template over the pipeline's message lists
    scheduler/     FLUX.2's FlowMatchEulerDiscreteScheduler (dynamic exponential shift)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.flux2_klein.tiny import (
    TinySizes,
    tiny_flux2_scheduler,
    tiny_flux2_transformer,
    tiny_flux2_vae,
)
from aitk.models.qwen_image.tiny import write_tokenizer
from aitk_common.files import staged_dir

# Mistral's format for the pipeline's messages (content: a list of {"type": "text"}).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set text = message['content'] if message['content'] is string else "
    "message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') "
    "| join('') %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{% else %}{{ '[INST]' + text + '[/INST]' }}{% endif %}"
    "{% endfor %}")


@dataclass(frozen=True)
class Flux2TinySizes(TinySizes):
    text_layers: int = 31  # hidden_states[30] must exist (the pipeline's default layers)
    max_sequence_length: int = 256  # the system message alone is 190 byte tokens


def build_tiny_flux2(target: Path, seed: int = 0,
                     sizes: Flux2TinySizes = Flux2TinySizes()) -> Path:
    from diffusers import Flux2Pipeline
    from transformers import AutoTokenizer, Mistral3Config, Mistral3ForConditionalGeneration

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.model_max_length = sizes.max_sequence_length
        eos = tokenizer.eos_token_id
        torch.manual_seed(seed)
        text_encoder = Mistral3ForConditionalGeneration(Mistral3Config(
            text_config=dict(
                model_type="mistral", vocab_size=len(tokenizer), hidden_size=sizes.text_dim,
                intermediate_size=sizes.text_dim * 2, num_hidden_layers=sizes.text_layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=sizes.text_dim // 2,
                max_position_embeddings=1024, bos_token_id=eos, eos_token_id=eos,
                pad_token_id=eos),
            vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32,
                               num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                               patch_size=14, image_size=56),
            tie_word_embeddings=False))
        Flux2Pipeline(scheduler=tiny_flux2_scheduler(), vae=tiny_flux2_vae(sizes),
                      text_encoder=text_encoder, tokenizer=tokenizer,
                      transformer=tiny_flux2_transformer(sizes, text_width=sizes.text_dim * 3,
                                                         guidance_embeds=True),
                      ).save_pretrained(tmp)
    return target
