"""LoRA files without `.alpha` entries, for loaders that refuse them: diffusers' SD3,
HiDream, LTX-2 and Krea 2 loaders take only keys with "lora" in them, and both they and
ComfyUI apply scale 1 to a module without an alpha. So the scale alpha / rank is folded
into the up weights on save (the delta B @ A * alpha / rank is unchanged) and read back
as alpha = rank, which the adapter rescales to its own alpha. The one owner of that
folding: each arch's key layout (`aitk/models/<arch>/`) calls it before or after its own
renaming."""

from __future__ import annotations

import torch

from aitk.adapters.keys import ALPHA_SUFFIX

LORA_UP, LORA_DOWN = ".lora_B.weight", ".lora_A.weight"


def fold_alphas(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LoRA modules' `alpha` folded into their up weights (B * alpha / rank), the alpha
    entries dropped: the delta B @ A * alpha / rank is unchanged and a reader that
    applies scale 1 without an alpha (diffusers, ComfyUI) gets it. Modules of other
    adapter kinds (LoKr) keep their alpha."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith(ALPHA_SUFFIX)]:
        module = key[: -len(ALPHA_SUFFIX)]
        up, down = module + LORA_UP, module + LORA_DOWN
        if up in out and down in out:
            rank = out[down].shape[0]
            alpha = float(out.pop(key))
            out[up] = (out[up].float() * (alpha / rank)).to(out[up].dtype)
    return out


def unfolded_alphas(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse reading: a LoRA module without an alpha has alpha = rank (scale 1),
    which the adapter then rescales to its own alpha."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith(LORA_DOWN)]:
        module = key[: -len(LORA_DOWN)]
        out.setdefault(module + ALPHA_SUFFIX,
                       torch.tensor(float(state_dict[key].shape[0])))
    return out
