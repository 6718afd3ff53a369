"""Krea 2 LoRA key layouts: aitk's internal (peft, diffusers module) names <-> files.

Written: `diffusion_model.` + Krea's original module names (the reference trainer's and
upstream ai-toolkit's layout, what ComfyUI runs the model with), lora_A / lora_B:

    diffusion_model.blocks.0.attn.wq.lora_A.weight      (diffusers transformer_blocks.0.attn.to_q)
    diffusion_model.blocks.0.mlp.gate.lora_B.weight     (diffusers transformer_blocks.0.ff.gate)
    diffusion_model.txtfusion.refiner_blocks.0.attn.wo.lora_A.weight   (text_fusion...to_out.0)

No `.alpha` keys: diffusers' Krea2Pipeline.load_lora_weights refuses a file with any key
that is not a LoRA weight (both in its `diffusion_model.` conversion and in the plain
path). The scale alpha / rank is folded into each up weight instead, so a loader that
assumes alpha = rank (diffusers and ComfyUI both do without the key) applies exactly the
trained delta; when alpha == rank nothing changes.

Read: that layout (a module without alpha has alpha = rank), the same with `.alpha` keys
(ComfyUI's, upstream's training adapters), kohya's lora_down / lora_up suffixes, and
diffusers names under `transformer.` or `diffusion_model.`. LoKr weights (whose factors
have no one up matrix to fold into) keep aitk's `diffusion_model.` + diffusers names
with alpha.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from aitk.adapters.alpha_folding import fold_alphas, unfolded_alphas
from aitk.adapters.keys import ALPHA_SUFFIX, from_public_keys, to_public_keys
from aitk.errors import AdapterKeyError

PREFIX = "diffusion_model."
DOWN, UP = ".lora_A.weight", ".lora_B.weight"
_SUFFIXES = {DOWN: DOWN, UP: UP, ".lora_down.weight": DOWN, ".lora_up.weight": UP,
             ALPHA_SUFFIX: ALPHA_SUFFIX}

# Inside a transformer or text-fusion block: diffusers module -> Krea's.
BLOCK = {"attn.to_q": "attn.wq", "attn.to_k": "attn.wk", "attn.to_v": "attn.wv",
         "attn.to_out.0": "attn.wo", "attn.to_gate": "attn.gate",
         "ff.gate": "mlp.gate", "ff.up": "mlp.up", "ff.down": "mlp.down"}
# Outside the blocks (diffusers' single-file converter's names).
STANDALONE = {"img_in": "first", "final_layer.linear": "last.linear",
              "time_embed.linear_1": "tmlp.0", "time_embed.linear_2": "tmlp.2",
              "time_mod_proj": "tproj.1", "txt_in.linear_1": "txtmlp.1",
              "txt_in.linear_2": "txtmlp.3", "text_fusion.projector": "txtfusion.projector"}
_BLOCK_FROM = {v: k for k, v in BLOCK.items()}
_STANDALONE_FROM = {v: k for k, v in STANDALONE.items()}
_DIFFUSERS_BLOCK = re.compile(
    r"^(transformer_blocks|text_fusion\.layerwise_blocks|text_fusion\.refiner_blocks)"
    r"\.(\d+)\.(.+)$")
_ORIGINAL_BLOCK = re.compile(
    r"^(blocks|txtfusion\.layerwise_blocks|txtfusion\.refiner_blocks)\.(\d+)\.(.+)$")
_BLOCK_KINDS = {"transformer_blocks": "blocks",
                "text_fusion.layerwise_blocks": "txtfusion.layerwise_blocks",
                "text_fusion.refiner_blocks": "txtfusion.refiner_blocks"}
_BLOCK_KINDS_FROM = {v: k for k, v in _BLOCK_KINDS.items()}


def to_original(module: str) -> str:
    """A diffusers module path -> Krea's (AdapterKeyError for one without a name)."""
    match = _DIFFUSERS_BLOCK.match(module)
    if match and match[3] in BLOCK:
        return f"{_BLOCK_KINDS[match[1]]}.{match[2]}.{BLOCK[match[3]]}"
    if module in STANDALONE:
        return STANDALONE[module]
    raise AdapterKeyError(f"{module!r} is not a Krea 2 layer with an original name")


def from_original(module: str) -> str | None:
    """Krea's module path -> the diffusers one (None: not one of Krea's names)."""
    match = _ORIGINAL_BLOCK.match(module)
    if match and match[3] in _BLOCK_FROM:
        return f"{_BLOCK_KINDS_FROM[match[1]]}.{match[2]}.{_BLOCK_FROM[match[3]]}"
    return _STANDALONE_FROM.get(module)


def _split(key: str) -> tuple[str, str]:
    for suffix, internal in _SUFFIXES.items():
        if key.endswith(suffix):
            return key[: -len(suffix)], internal
    raise AdapterKeyError(f"adapter key {key!r} is not a LoRA weight or alpha "
                          "(lora_A/lora_B, lora_down/lora_up, alpha)")


def to_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (LoRA weights + `<module>.alpha`) -> `diffusion_model.` + Krea's
    names, each alpha folded into its up weight."""
    if any(".lokr_" in k for k in state_dict):
        return to_public_keys(state_dict)
    out: dict[str, torch.Tensor] = {}
    for key, value in fold_alphas(dict(state_dict)).items():
        module, suffix = _split(key)
        if suffix != ALPHA_SUFFIX:  # an alpha left after folding has no LoRA module
            out[PREFIX + to_original(module) + suffix] = value
    return out


def from_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any read layout -> internal names, with an alpha for every LoRA module (rank
    where the file has none: what a folded file means)."""
    if any(".lokr_" in k for k in state_dict):
        return from_public_keys(state_dict)
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        for prefix in (PREFIX, "transformer."):
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        module, suffix = _split(key)
        internal = from_original(module) or module
        if internal + suffix in out:
            raise AdapterKeyError(f"adapter key {key!r} duplicates {internal + suffix!r}")
        out[internal + suffix] = value
    return unfolded_alphas(out)
