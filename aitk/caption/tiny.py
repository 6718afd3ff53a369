"""Tiny random captioning models, built locally (nothing downloaded): hub-style folders
(config.json, weights, tokenizer, preprocessor_config.json at the top) that load through
the same `from_pretrained` calls as Qwen/Qwen2.5-VL-7B-Instruct or Qwen/Qwen3-VL-8B-
Instruct. Their captions are noise; the tests (and the web UI's browser test) check the
plumbing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112  # a few merged vision tokens a picture
TINY_NEW_TOKENS = 8
TINY_FAMILIES = ("qwen2_5_vl", "qwen3_vl")


def _config(family: str, vocab_size: int, ids: dict[str, int], eos: int) -> Any:
    import transformers

    text = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 1024, "bos_token_id": eos, "eos_token_id": eos,
            "pad_token_id": eos}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": 32}
    if family == "qwen2_5_vl":
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 2, 4]}
        vision["fullatt_block_indexes"] = [0]
        cls = transformers.Qwen2_5_VLConfig
    elif family == "qwen3_vl":
        text |= {"head_dim": 16, "rope_scaling": {"rope_type": "default",
                                                   "mrope_interleaved": True,
                                                   "mrope_section": [4, 2, 2]}}
        vision |= {"patch_size": 16, "deepstack_visual_indexes": [0],
                   "num_position_embeddings": 64}
        cls = transformers.Qwen3VLConfig
    else:
        raise ValueError(f"no tiny {family!r}; there are {', '.join(TINY_FAMILIES)}")
    return cls(text_config=text, vision_config=vision, bos_token_id=eos,
               eos_token_id=eos, pad_token_id=eos, **ids)


def build_tiny_vlm(target: Path, seed: int = 0, family: str = "qwen2_5_vl") -> Path:
    """A tiny random model of `family` (one of TINY_FAMILIES) at `target`."""
    import torch
    import transformers
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from aitk.caption.vlm import FAMILIES
    from aitk.models.qwen_image.tiny import write_tokenizer
    from aitk.models.qwen_image_edit.vision import VISION_TOKENS
    from aitk_common.files import staged_dir

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp, VISION_TOKENS)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        start, pad, end = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
        ids = {"vision_start_token_id": start, "image_token_id": pad,
               "vision_end_token_id": end, "video_token_id": pad}
        config = _config(family, len(tokenizer), ids, tokenizer.eos_token_id)
        torch.manual_seed(seed)
        model = getattr(transformers, FAMILIES[family].model_class)(config)
        # Random weights could emit the end token at once: no end, always the full length.
        model.generation_config.eos_token_id = None
        model.generation_config.max_new_tokens = TINY_NEW_TOKENS
        model.save_pretrained(tmp)
        patch = config.vision_config.patch_size  # 14 for Qwen2.5-VL, 16 for Qwen3-VL
        Qwen2VLImageProcessorPil(patch_size=patch, min_pixels=TINY_MIN_PIXELS,
                                 max_pixels=TINY_MAX_PIXELS).save_pretrained(tmp)
    return target
