"""Wan LoRA keys: diffusers module names (what peft sees) <-> the original Wan names.

Files use the original Wan checkpoint names with the `diffusion_model.` prefix, the
layout ComfyUI's Wan loader reads and diffusers' `WanPipeline.load_lora_weights`
converts (`_convert_non_diffusers_wan_lora_to_diffusers`), each module with its alpha:

    blocks.0.attn1.to_q          <-> blocks.0.self_attn.q        (k, v; to_out.0 <-> o)
    blocks.0.attn2.to_q          <-> blocks.0.cross_attn.q       (k, v, o)
    blocks.0.attn2.add_k_proj    <-> blocks.0.cross_attn.k_img   (v_img; 2.1 i2v only)
    blocks.0.ffn.net.0.proj      <-> blocks.0.ffn.0
    blocks.0.ffn.net.2           <-> blocks.0.ffn.2

Reading also accepts diffusers names (`transformer.` prefix, or aitk's older
`diffusion_model.` + diffusers names): a name that is already a diffusers one is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from aitk.adapters.keys import from_public_keys, to_public_keys

# (diffusers module suffix inside a block, original Wan name), per adapted Linear.
_MODULES = (
    ("attn1.to_q", "self_attn.q"), ("attn1.to_k", "self_attn.k"),
    ("attn1.to_v", "self_attn.v"), ("attn1.to_out.0", "self_attn.o"),
    ("attn2.to_q", "cross_attn.q"), ("attn2.to_k", "cross_attn.k"),
    ("attn2.to_v", "cross_attn.v"), ("attn2.to_out.0", "cross_attn.o"),
    ("attn2.add_k_proj", "cross_attn.k_img"), ("attn2.add_v_proj", "cross_attn.v_img"),
    ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
)
TO_ORIGINAL = dict(_MODULES)
TO_DIFFUSERS = {orig: diff for diff, orig in _MODULES}


def _rename(key: str, table: Mapping[str, str]) -> str:
    """Swap the module part after `blocks.<i>.` (the adapter suffix is kept)."""
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "blocks":
        return key
    rest = ".".join(parts[2:])
    for old, new in table.items():
        if rest.startswith(old + "."):
            return ".".join(parts[:2]) + "." + new + rest[len(old):]
    return key


def to_wan_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal (diffusers) names -> public original-Wan names with `diffusion_model.`."""
    return to_public_keys({_rename(k, TO_ORIGINAL): v for k, v in state_dict.items()})


def from_wan_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public names (original Wan, or diffusers) -> internal diffusers names."""
    return {_rename(k, TO_DIFFUSERS): v for k, v in from_public_keys(state_dict).items()}
