"""SDXL's LoRA key layout: kohya's (aitk.models.kohya, which says what reads it), with
the two text encoders as `lora_te1_` (CLIP ViT-L) and `lora_te2_` (OpenCLIP bigG), as
ComfyUI maps them when both `clip_l` and `clip_g` are present:

    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight
    lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight
    lora_te2_text_model_encoder_layers_0_mlp_fc1.alpha

The other candidate, `unet.` + diffusers names (peft's layout), gets its alpha in
diffusers only from safetensors metadata, and ComfyUI expects those names with a
`.processor.` infix: no single `unet.` file serves both. It is read, as aitk's older
`diffusion_model.` + internal names are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from aitk.models import kohya

LAYOUT = kohya.KohyaLayout("SDXL", {"text_encoder": "lora_te1_",
                                    "text_encoder_2": "lora_te2_"})
KOHYA_PREFIX = kohya.UNET_PREFIX
DIFFUSERS_PREFIX = kohya.DIFFUSERS_UNET_PREFIX


def to_kohya(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (LoRA weights + `<module>.alpha`) -> SDXL's kohya names."""
    return kohya.to_kohya(state_dict, LAYOUT)


def from_files(state_dict: Mapping[str, torch.Tensor], module_names: Iterable[str],
               text_encoder_names: Mapping[str, Iterable[str]] | None = None
               ) -> dict[str, torch.Tensor]:
    """Any of the read layouts -> internal names, with an alpha for every module
    (`module_names`: the UNet's; `text_encoder_names`: each trained encoder's)."""
    return kohya.from_files(state_dict, LAYOUT, module_names, text_encoder_names)
