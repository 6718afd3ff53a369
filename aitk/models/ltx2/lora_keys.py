"""LTX-2 LoRA keys: `diffusion_model.` + the transformer's module names, no alpha keys.

Lightricks' checkpoint names and diffusers' agree for every Linear a LoRA adapts
(`transformer_blocks.N.attn1.to_q`, `audio_attn2.to_out.0`, `audio_to_video_attn.to_k`,
`ff.net.0.proj`, ...; they differ only in embedders and norms), so ComfyUI's LTXAV
loader (comfy/lora.py maps `diffusion_model.<module>` and `<module>`) and diffusers'
`LTX2Pipeline.load_lora_weights` (which strips `diffusion_model.`) read the same file.
diffusers refuses any key without "lora" in it, `.alpha` included; so each module's
scale alpha / rank is folded into its up (B) weight on save and no alpha is written,
which both loaders take as scale 1. Reading a file back gives each module alpha = rank
(scale 1) unless the file carries alphas of its own (upstream's, or LoKr files, which
keep theirs: diffusers does not load LoKr).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from aitk.adapters.keys import ALPHA_SUFFIX, from_public_keys, module_of, to_public_keys

DOWN, UP = ".lora_A.weight", ".lora_B.weight"


def to_ltx2_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names with `<module>.alpha` -> public names, alpha folded into lora_B."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith(ALPHA_SUFFIX)]:
        mod = key[: -len(ALPHA_SUFFIX)]
        if mod + UP not in state_dict:
            continue  # not a LoRA module (LoKr): keep its alpha
        rank = state_dict[mod + DOWN].shape[0]
        up = state_dict[mod + UP]
        out[mod + UP] = (up.float() * (float(state_dict[key]) / rank)).to(up.dtype)
        del out[key]
    return to_public_keys(out)


def from_ltx2_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public names -> internal names; a LoRA module without an alpha gets alpha = rank."""
    out = from_public_keys(state_dict)
    for mod in {module_of(k) for k in out if k.endswith(DOWN)}:
        if mod + ALPHA_SUFFIX not in out:
            out[mod + ALPHA_SUFFIX] = torch.tensor(float(out[mod + DOWN].shape[0]))
    return out
