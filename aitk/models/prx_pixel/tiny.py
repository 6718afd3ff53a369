"""A tiny random-initialised `prx_pixel` model folder, built locally (no download).

The layout is the diffusers one (`model_index.json`, `transformer/ text_encoder/
tokenizer/ scheduler/`), written by PRXPixelPipeline.save_pretrained, so the folder loads
through the same `from_pretrained` calls as Photoroom/prxpixel-t2i and through
`PRXPixelPipeline.from_pretrained`. Shapes follow the released model where it matters
(pixel space: `in_channels=3`, `patch_size=16`, a bottleneck `img_in`, resolution
embeds, scheduler shift 3.0); sizes are tiny. The text encoder is a Qwen3-VL text tower
alone (`Qwen3VLTextModel`, no vision tower); the tokenizer is qwen_image's byte-level one
(one token per byte, built locally).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir


@dataclass(frozen=True)
class TinySizes:
    text_dim: int = 32
    text_heads: int = 2
    hidden: int = 32
    heads: int = 2  # head dim 16 = rope axes (8, 8)
    depth: int = 2
    patch: int = 16
    bottleneck: int = 16
    prompt_max_tokens: int = 64


def build_tiny_prx_pixel(target: Path, seed: int = 0, sizes: TinySizes = TinySizes()) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, PRXPixelPipeline, PRXTransformer2DModel
    from transformers import AutoTokenizer, Qwen3VLTextConfig, Qwen3VLTextModel

    from aitk.models.qwen_image.tiny import write_tokenizer

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        torch.manual_seed(seed)
        head_dim = sizes.text_dim // sizes.text_heads
        half = head_dim // 2
        te_config = Qwen3VLTextConfig(
            vocab_size=len(tokenizer), hidden_size=sizes.text_dim,
            intermediate_size=sizes.text_dim * 2, num_hidden_layers=1,
            num_attention_heads=sizes.text_heads, num_key_value_heads=1, head_dim=head_dim,
            max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                             "mrope_section": [half - 2 * (half // 4), half // 4, half // 4],
                             "mrope_interleaved": True})
        text_encoder = Qwen3VLTextModel(te_config)
        transformer = PRXTransformer2DModel(
            in_channels=3, patch_size=sizes.patch, context_in_dim=sizes.text_dim,
            hidden_size=sizes.hidden, mlp_ratio=2.0, num_heads=sizes.heads,
            depth=sizes.depth, axes_dim=[sizes.hidden // sizes.heads // 2] * 2,
            bottleneck_size=sizes.bottleneck, resolution_embeds=True)
        with torch.no_grad():  # zero-initialised modulation: give it values, so the
            for name, p in transformer.named_parameters():  # blocks (and LoRA) matter
                if "modulation" in name:
                    p.normal_(0.0, 0.05)
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                                    use_dynamic_shifting=False)
        # The pipeline writes model_index.json beside the parts, as a hub folder has.
        PRXPixelPipeline(transformer=transformer, scheduler=scheduler,
                         text_encoder=text_encoder, tokenizer=tokenizer,
                         default_sample_size=1024,
                         prompt_max_tokens=sizes.prompt_max_tokens).save_pretrained(tmp)
    return target
