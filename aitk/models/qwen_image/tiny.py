"""A tiny random-initialised `qwen_image` model folder, built locally (no download).

The layout is the diffusers one (`model_index.json`, `transformer/ vae/ text_encoder/
tokenizer/ scheduler/`), written by QwenImagePipeline.save_pretrained, so the folder loads
through the same `from_pretrained` calls as Qwen/Qwen-Image. The tokenizer is a
byte-level BPE with no merges (one token per byte) plus Qwen's chat special tokens:
it needs no vocabulary download and tokenizes any text the real template produces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk_common.files import staged_dir

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TinySizes:
    text_dim: int = 32
    heads: int = 2
    head_dim: int = 32  # rope axes (8, 12, 12) sum to it
    layers: int = 2
    z_dim: int = 4
    vae_base_dim: int = 8


def _byte_vocab() -> dict[str, int]:
    """GPT-2's byte -> printable-character table, the alphabet byte-level BPE uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {chars[b]: b for b in range(256)}


def write_tokenizer(folder: Path, extra_special: tuple[str, ...] = ()) -> None:
    from transformers import Qwen2Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = Qwen2Tokenizer(vocab=_byte_vocab(), merges=[], unk_token=None,
                         eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS[1:],
                                                          *extra_special]})
    tok.save_pretrained(folder)


def build_tiny_qwen_image(target: Path, seed: int = 0, sizes: TinySizes = TinySizes(),
                          *, pipeline: str = "QwenImagePipeline",
                          vision_tokens: tuple[str, ...] = (),
                          extra: Callable[[Path], None] | None = None) -> Path:
    """The folder for `pipeline` (a diffusers class name; the edit archs pass theirs,
    with `processor` left out). `vision_tokens` (start, image pad, end) join the tokenizer
    and the text encoder's config; `extra(staging folder)` writes more parts."""
    import diffusers
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageTransformer2DModel,
    )
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp / "tokenizer", vision_tokens)
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tokenizer")
        ids = {}
        if vision_tokens:
            start, pad, end = tokenizer.convert_tokens_to_ids(list(vision_tokens))
            ids = {"vision_start_token_id": start, "image_token_id": pad,
                   "vision_end_token_id": end, "video_token_id": pad}
        vocab_size, eos = len(tokenizer), tokenizer.eos_token_id
        torch.manual_seed(seed)
        half = sizes.text_dim // sizes.heads // 2
        te_config = Qwen2_5_VLConfig(
            text_config={
                "vocab_size": vocab_size, "hidden_size": sizes.text_dim,
                "intermediate_size": sizes.text_dim * 2, "num_hidden_layers": 1,
                "num_attention_heads": sizes.heads, "num_key_value_heads": 1,
                "max_position_embeddings": 4096, "bos_token_id": eos, "eos_token_id": eos,
                "pad_token_id": eos,
                "rope_scaling": {"type": "mrope", "mrope_section": [half // 4, half // 4,
                                                                    half - half // 2]},
            },
            vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                           "num_heads": 2, "out_hidden_size": sizes.text_dim,
                           "fullatt_block_indexes": [0]},
            bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **ids,
        )
        text_encoder = Qwen2_5_VLForConditionalGeneration(te_config)
        vae = AutoencoderKLQwenImage(base_dim=sizes.vae_base_dim, z_dim=sizes.z_dim,
                                     dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                     latents_mean=[0.1, -0.2, 0.3, 0.0][: sizes.z_dim],
                                     latents_std=[1.5, 2.0, 1.2, 0.8][: sizes.z_dim])
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=sizes.z_dim * 4, out_channels=sizes.z_dim,
            num_layers=sizes.layers, attention_head_dim=sizes.head_dim,
            num_attention_heads=sizes.heads, joint_attention_dim=sizes.text_dim,
            axes_dims_rope=(8, 12, 12))
        with torch.no_grad():  # random modulation, so LoRA gradients are not all zero
            for name, p in transformer.named_parameters():
                if "mod" in name or "norm_out" in name or "proj_out" in name:
                    p.normal_(0.0, 0.02)
        scheduler = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5,
            max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192,
            time_shift_type="exponential", shift_terminal=0.02)
        # The pipeline writes model_index.json beside the parts, as a hub folder has.
        parts = dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                     tokenizer=tokenizer, transformer=transformer)
        if pipeline != "QwenImagePipeline":
            parts["processor"] = None
        level = diffusers.utils.logging.get_verbosity()
        diffusers.utils.logging.set_verbosity_error()  # "processor=None cannot be saved"
        try:
            getattr(diffusers, pipeline)(**parts).save_pretrained(tmp)
        finally:
            diffusers.utils.logging.set_verbosity(level)
        if extra is not None:
            extra(tmp)
    return target
