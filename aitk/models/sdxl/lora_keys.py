"""SDXL LoRA key layouts: aitk's internal (peft) names <-> the files other tools read.

Written: kohya's layout, the one every SDXL tool reads, alpha included, in one file:

    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight
    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight
    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.alpha

diffusers' `StableDiffusionXLPipeline.load_lora_weights` converts it and applies each
`.alpha` (as network alphas; tests/aitk/models/test_sdxl.py proves the image); ComfyUI
maps `lora_unet_` + diffusers module names onto its UNet (comfy `unet_to_diffusers`)
and reads `.alpha` keys. The other candidate, `unet.` + diffusers names (peft's
layout), gets its alpha in diffusers only from safetensors metadata, and ComfyUI
expects those names with a `.processor.` infix: no single `unet.` file serves both.

Read: that layout, `unet.` + diffusers names (`lora_A`/`lora_B` or
`lora_down`/`lora_up`; a module without `.alpha` has alpha = rank, diffusers' reading),
and aitk's older `diffusion_model.` + internal names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from aitk.adapters.keys import ALPHA_SUFFIX, PUBLIC_PREFIX, from_public_keys, module_of
from aitk.errors import AdapterKeyError

KOHYA_PREFIX = "lora_unet_"
DIFFUSERS_PREFIX = "unet."
_SUFFIXES = {  # file suffix -> internal suffix
    ".lora_down.weight": ".lora_A.weight", ".lora_up.weight": ".lora_B.weight",
    ".lora_A.weight": ".lora_A.weight", ".lora_B.weight": ".lora_B.weight",
    ALPHA_SUFFIX: ALPHA_SUFFIX,
}
_TO_KOHYA = {".lora_A.weight": ".lora_down.weight", ".lora_B.weight": ".lora_up.weight",
             ALPHA_SUFFIX: ALPHA_SUFFIX}


def _split(key: str) -> tuple[str, str]:
    """`a.b.lora_A.weight` -> (`a.b`, `.lora_A.weight`)."""
    for suffix in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], suffix
    raise AdapterKeyError(f"adapter key {key!r} is not a LoRA weight or alpha "
                          "(lora_A/lora_B, lora_down/lora_up, alpha)")


def to_kohya(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (LoRA weights + `<module>.alpha`) -> kohya `lora_unet_` names."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        module, suffix = _split(key)
        if suffix not in _TO_KOHYA:
            raise AdapterKeyError(f"{key!r}: only LoRA weights have a kohya name")
        out[KOHYA_PREFIX + module.replace(".", "_") + _TO_KOHYA[suffix]] = value
    return out


def from_files(state_dict: Mapping[str, torch.Tensor],
               module_names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Any of the read layouts -> internal names, with an alpha for every module.

    `module_names`: the UNet's module paths, which resolve kohya's `_`-joined names
    (a `_` there may be a separator or part of a name such as `down_blocks`)."""
    if any(k.startswith(PUBLIC_PREFIX) for k in state_dict):
        return from_public_keys(state_dict)
    by_kohya = {name.replace(".", "_"): name for name in module_names}
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.startswith(KOHYA_PREFIX):
            stem, suffix = _split(key[len(KOHYA_PREFIX):])
            module = by_kohya.get(stem)
            if module is None:
                raise AdapterKeyError(f"adapter key {key!r} names no layer of this UNet")
        elif key.startswith(DIFFUSERS_PREFIX):
            module, suffix = _split(key[len(DIFFUSERS_PREFIX):])
        else:
            what = ("a text-encoder LoRA (not trained or loaded by aitk)"
                    if key.startswith(("lora_te", "text_encoder")) else "an unknown layout")
            raise AdapterKeyError(
                f"adapter key {key!r} is {what}; SDXL LoRA files use {KOHYA_PREFIX!r}, "
                f"{DIFFUSERS_PREFIX!r} or {PUBLIC_PREFIX!r} keys")
        name = module + _SUFFIXES[suffix]
        if name in out:
            raise AdapterKeyError(f"adapter key {key!r} duplicates {name!r}")
        out[name] = value
    # Without an alpha the delta is applied at scale 1 (alpha = rank), as diffusers does.
    for key, value in list(out.items()):
        if key.endswith(".lora_A.weight"):
            out.setdefault(module_of(key) + ALPHA_SUFFIX,
                           torch.tensor(float(value.shape[0])))
    return out
