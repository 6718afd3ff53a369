"""A tiny random Qwen2.5-VL captioning model, built locally (nothing downloaded): a
hub-style folder (config.json, weights, tokenizer, preprocessor_config.json at the top)
that loads through the same `from_pretrained` calls as Qwen/Qwen2.5-VL-7B-Instruct. Its
captions are noise; the tests (and the web UI's browser test) check the plumbing.
"""

from __future__ import annotations

from pathlib import Path

TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112  # at most 16 merged vision tokens a picture
TINY_NEW_TOKENS = 8


def build_tiny_vlm(target: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from aitk.models.qwen_image.tiny import write_tokenizer
    from aitk.models.qwen_image_edit.vision import VISION_TOKENS
    from aitk_common.files import staged_dir

    target = Path(target)
    with staged_dir(target) as tmp:
        write_tokenizer(tmp, VISION_TOKENS)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        start, pad, end = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
        eos = tokenizer.eos_token_id
        torch.manual_seed(seed)
        config = Qwen2_5_VLConfig(
            text_config={"vocab_size": len(tokenizer), "hidden_size": 32,
                         "intermediate_size": 64, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "num_key_value_heads": 1,
                         "max_position_embeddings": 1024, "bos_token_id": eos,
                         "eos_token_id": eos, "pad_token_id": eos,
                         "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}},
            vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                           "num_heads": 2, "out_hidden_size": 32,
                           "fullatt_block_indexes": [0]},
            vision_start_token_id=start, image_token_id=pad, vision_end_token_id=end,
            video_token_id=pad, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        model = Qwen2_5_VLForConditionalGeneration(config)
        # Random weights could emit the end token at once: no end, always the full length.
        model.generation_config.eos_token_id = None
        model.generation_config.max_new_tokens = TINY_NEW_TOKENS
        model.save_pretrained(tmp)
        Qwen2VLImageProcessorPil(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS
                                 ).save_pretrained(tmp)
    return target
