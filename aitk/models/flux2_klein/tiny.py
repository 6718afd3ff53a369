"""A tiny random-initialised FLUX.2 [klein] model folder, built locally (no download).

The layout is the diffusers one, written by `Flux2KleinPipeline.save_pretrained`
(`model_index.json`, `transformer/ vae/ text_encoder/ tokenizer/ scheduler/`), so the
folder loads through the same `from_pretrained` calls as black-forest-labs/FLUX.2-klein-*:

    transformer/   Flux2Transformer2DModel: 1 double + 1 single block, 2 heads of 16
    vae/           AutoencoderKLFlux2: 4 levels (scale factor 8), 4 latent channels,
                   BatchNorm over the 2x2-patchified 16 channels with non-trivial
                   running statistics (so the normalisation is really exercised)
    text_encoder/  Qwen3ForCausalLM, hidden 32 and 28 layers, so the pipeline's default
                   stacked layers (9, 18, 27) exist and the prompt width is 3 x 32
    tokenizer/     the byte-level Qwen tokenizer of the qwen_image tiny model
                   (aitk.models.qwen_image.tiny.write_tokenizer) plus a Qwen3-style chat
                   template (user turn, assistant turn, empty think block when
                   `enable_thinking` is false), what `apply_chat_template` needs
    scheduler/     FlowMatchEulerDiscreteScheduler, dynamic exponential shift

Zero-initialised layers of diffusers' transformer (modulation, output) would give exactly
zero LoRA gradients; they get small random values here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.qwen_image.tiny import write_tokenizer
from aitk_common.files import staged_dir

# Qwen3's chat format, written for the tiny tokenizer (the real tokenizer has its own).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")


@dataclass(frozen=True)
class TinySizes:
    text_dim: int = 32
    text_layers: int = 28  # hidden_states[27] must exist (the pipeline's default layers)
    max_sequence_length: int = 64  # the tokenizer's model_max_length; klein uses 512
    heads: int = 2
    head_dim: int = 16  # rope axes (4, 4, 4, 4) sum to it
    double_layers: int = 1
    single_layers: int = 1
    latent_channels: int = 4
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8


def tiny_flux2_vae(sizes: TinySizes = TinySizes()):
    """AutoencoderKLFlux2 at tiny width, its BatchNorm with running statistics as a
    trained VAE has them (so the normalisation is really exercised)."""
    from diffusers import AutoencoderKLFlux2

    n = len(sizes.vae_channels)
    vae = AutoencoderKLFlux2(
        latent_channels=sizes.latent_channels, block_out_channels=sizes.vae_channels,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n, layers_per_block=1,
        norm_num_groups=8, sample_size=64)
    with torch.no_grad():
        vae.bn.running_mean.normal_(0.0, 0.3)
        vae.bn.running_var.uniform_(0.5, 2.0)
    return vae


def tiny_flux2_transformer(sizes: TinySizes = TinySizes(), text_width: int = 96,
                           guidance_embeds: bool = False):
    """Flux2Transformer2DModel at tiny width reading `text_width`-wide prompt rows, its
    zero-initialised modulation and output layers made random (so LoRA gradients are
    not all zero)."""
    from diffusers import Flux2Transformer2DModel

    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=sizes.latent_channels * 4,
        num_layers=sizes.double_layers, num_single_layers=sizes.single_layers,
        attention_head_dim=sizes.head_dim, num_attention_heads=sizes.heads,
        joint_attention_dim=text_width, timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=guidance_embeds)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "modulation" in name or "norm_out" in name or "proj_out" in name:
                p.normal_(0.0, 0.05)
    return transformer


def tiny_flux2_scheduler():
    """FLUX.2's scheduler config: dynamic exponential shift (the pipelines set mu)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096,
        time_shift_type="exponential")


def build_tiny_flux2_klein(target: Path, seed: int = 0, sizes: TinySizes = TinySizes(),
                           is_distilled: bool = False) -> Path:
    from diffusers import Flux2KleinPipeline
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.model_max_length = sizes.max_sequence_length
        eos = tokenizer.eos_token_id
        torch.manual_seed(seed)
        text_encoder = Qwen3ForCausalLM(Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=sizes.text_dim,
            intermediate_size=sizes.text_dim * 2, num_hidden_layers=sizes.text_layers,
            num_attention_heads=2, num_key_value_heads=1, head_dim=sizes.text_dim // 2,
            max_position_embeddings=1024, bos_token_id=eos, eos_token_id=eos,
            pad_token_id=eos, tie_word_embeddings=True))
        vae = tiny_flux2_vae(sizes)
        transformer = tiny_flux2_transformer(sizes, text_width=sizes.text_dim * 3)
        Flux2KleinPipeline(scheduler=tiny_flux2_scheduler(), vae=vae,
                           text_encoder=text_encoder, tokenizer=tokenizer,
                           transformer=transformer,
                           is_distilled=is_distilled).save_pretrained(tmp)
    return target
