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

from aitk.adapters.alpha_folding import fold_alphas, unfolded_alphas
from aitk.adapters.keys import from_public_keys, to_public_keys


def to_ltx2_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names with `<module>.alpha` -> public names, alpha folded into lora_B."""
    return to_public_keys(fold_alphas(dict(state_dict)))


def from_ltx2_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public names -> internal names; a LoRA module without an alpha gets alpha = rank."""
    return unfolded_alphas(from_public_keys(state_dict))
