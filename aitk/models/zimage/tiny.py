"""A tiny random-initialised Z-Image model folder, built locally (no download).

The layout is the diffusers one, written by `ZImagePipeline.save_pretrained`
(`model_index.json`, `transformer/ text_encoder/ tokenizer/ vae/ scheduler/`), so the
folder loads through the same `from_pretrained` calls as Tongyi-MAI/Z-Image-Turbo:

    transformer/   ZImageTransformer2DModel: 1 main layer + 1 noise- and 1 context-
                   refiner block, 2 heads of 16 (rope axes 4, 6, 6)
    text_encoder/  Qwen3 (hidden 32, 2 layers: the pipeline reads hidden_states[-2],
                   the output of the last layer but one)
    tokenizer/     the byte-level Qwen tokenizer of the qwen_image tiny model with the
                   Qwen3 chat template of the klein tiny model
    vae/           FLUX.1's AutoencoderKL shape (shift and scale factors), 4 latent channels
    scheduler/     FlowMatchEulerDiscreteScheduler, fixed shift 3 (Z-Image's)

The transformer's modulation and output layers get small random values on top of
diffusers' init, so no LoRA gradient is exactly zero however the init changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.flux.tiny import FluxSizes, write_tiny_vae
from aitk.models.flux2_klein.tiny import CHAT_TEMPLATE
from aitk.models.qwen_image.tiny import write_tokenizer
from aitk_common.files import staged_dir


@dataclass(frozen=True)
class TinySizes:
    text_dim: int = 32
    text_layers: int = 2
    max_sequence_length: int = 64  # the tokenizer's model_max_length; Z-Image uses 512
    heads: int = 2
    axes_dims: tuple[int, int, int] = (4, 6, 6)  # sums to the head width, 16
    layers: int = 1
    refiner_layers: int = 1
    latent_channels: int = 4
    vae_channels: tuple[int, ...] = (8, 16, 16, 16)  # 4 levels: scale factor 8


def build_tiny_zimage(target: Path, seed: int = 0, sizes: TinySizes = TinySizes()) -> Path:
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        ZImagePipeline,
        ZImageTransformer2DModel,
    )
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.model_max_length = sizes.max_sequence_length
        eos = tokenizer.eos_token_id
        torch.manual_seed(seed)
        text_encoder = Qwen3Model(Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=sizes.text_dim,
            intermediate_size=sizes.text_dim * 2, num_hidden_layers=sizes.text_layers,
            num_attention_heads=2, num_key_value_heads=1, head_dim=sizes.text_dim // 2,
            max_position_embeddings=1024, bos_token_id=eos, eos_token_id=eos,
            pad_token_id=eos))
        # Written, then read back as the pipeline's part (its save rewrites the same files).
        write_tiny_vae(tmp / "vae", FluxSizes(latent_channels=sizes.latent_channels,
                                              vae_channels=sizes.vae_channels))
        vae = AutoencoderKL.from_pretrained(tmp / "vae")
        head = sum(sizes.axes_dims)
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=sizes.latent_channels,
            dim=head * sizes.heads, n_layers=sizes.layers, n_refiner_layers=sizes.refiner_layers,
            n_heads=sizes.heads, n_kv_heads=sizes.heads, cap_feat_dim=sizes.text_dim,
            axes_dims=list(sizes.axes_dims), axes_lens=[256, 64, 64])
        with torch.no_grad():
            for name, p in transformer.named_parameters():
                if "adaLN_modulation" in name or "all_final_layer" in name:
                    p.add_(torch.randn_like(p) * 0.05)
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                                    use_dynamic_shifting=False)
        ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                       tokenizer=tokenizer, transformer=transformer).save_pretrained(tmp)
    return target
