"""Lumina-Image 2.0 LoRA key layouts: aitk's internal (peft, diffusers module) names <->
files.

Written: `diffusion_model.` + the authors' NextDiT module names (what ComfyUI runs
Lumina 2 with, and maps by its generic `diffusion_model.` rule), the LoRA scale folded
into the up weights and no `.alpha` entries:

    diffusion_model.layers.0.attention.qkv.lora_A.weight    (rank 3r: q, k, v fused)
    diffusion_model.layers.0.attention.qkv.lora_B.weight    (block-diagonal)
    diffusion_model.layers.0.attention.out.lora_A.weight     (diffusers attn.to_out.0)
    diffusion_model.layers.0.feed_forward.w1.lora_A.weight   (diffusers linear_1; w2, w3)
    diffusion_model.layers.0.adaLN_modulation.1.lora_A.weight  (diffusers norm1.linear)
    ... and the same under noise_refiner.N (context_refiner.N has no modulation)

Why: diffusers' `Lumina2Pipeline.load_lora_weights` converts exactly this layout
(`_convert_non_diffusers_lumina2_lora_to_diffusers`: each of q, k, v gets the whole
down and its rows of the up, split at Lumina 2's 2304/768/768, which a block-diagonal up
makes exact) and refuses anything else in such a file, an `.alpha` key included; its
`transformer.` layout is refused too as soon as it carries `.alpha`. ComfyUI applies
scale 1 without an alpha, diffusers as well: so the scale lives in the up weights.
ComfyUI's Lumina 2 table for `transformer.` names (comfy.utils.z_image_to_diffusers) is
Z-Image's (`attention.to_q`, equal q/k/v slices), not diffusers' Lumina 2 names.

Read: that layout (a fused qkv written here splits back exactly; a fused LoRA whose
down is shared between q, k and v gives each the whole down), and `transformer.` /
`diffusion_model.` + diffusers names, with or without `.alpha` (none: alpha = rank).
LoKr weights (no fused form) are written as `transformer.` + diffusers names with alpha.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from aitk.adapters.keys import ALPHA_SUFFIX, from_public_keys
from aitk.errors import AdapterKeyError

FILE_PREFIX = "diffusion_model."
DIFFUSERS_PREFIX = "transformer."
DOWN, UP = ".lora_A.weight", ".lora_B.weight"
_SUFFIXES = {DOWN: DOWN, UP: UP, ".lora_down.weight": DOWN, ".lora_up.weight": UP,
             ALPHA_SUFFIX: ALPHA_SUFFIX}
QKV = ("attn.to_q", "attn.to_k", "attn.to_v")
# Inside a block: diffusers module -> the authors' module (q/k/v: fused `attention.qkv`).
RENAMES = {"attn.to_out.0": "attention.out", "feed_forward.linear_1": "feed_forward.w1",
           "feed_forward.linear_2": "feed_forward.w2", "feed_forward.linear_3": "feed_forward.w3",
           "norm1.linear": "adaLN_modulation.1"}
_FROM_ORIGINAL = {v: k for k, v in RENAMES.items()}
_BLOCK = re.compile(r"^((?:layers|noise_refiner|context_refiner)\.\d+)\.(.+)$")
_ORIGINAL_MARKS = (".attention.", ".feed_forward.w", ".adaLN_modulation.")


def _modules(state_dict: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{module: {suffix: tensor}}; every LoRA module gets an alpha (rank where none)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        suffix = next((s for s in _SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            raise AdapterKeyError(f"adapter key {key!r} is not a LoRA weight or alpha")
        out.setdefault(key[: -len(suffix)], {})[_SUFFIXES[suffix]] = value
    for module, parts in out.items():
        if DOWN not in parts or UP not in parts:
            raise AdapterKeyError(f"LoRA module {module!r} lacks its down or up weight")
        parts.setdefault(ALPHA_SUFFIX, torch.tensor(float(parts[DOWN].shape[0])))
    return out


def _scaled_up(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    rank = parts[DOWN].shape[0]
    return parts[UP] * (float(parts[ALPHA_SUFFIX]) / rank)


def to_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (LoRA + `<module>.alpha`) -> the written layout (module doc)."""
    if any(".lokr_" in k for k in state_dict):
        return {DIFFUSERS_PREFIX + k: v for k, v in state_dict.items()}
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for module, parts in _modules(state_dict).items():
        match = _BLOCK.match(module)
        if match is None or (match[2] not in RENAMES and match[2] not in QKV):
            raise AdapterKeyError(f"{module!r} is not a Lumina 2 block layer with an "
                                  "original name")
        block, rest = match[1], match[2]
        if rest in QKV:
            fused.setdefault(block, {})[rest] = parts
            continue
        stem = f"{FILE_PREFIX}{block}.{RENAMES[rest]}"
        out[stem + DOWN] = parts[DOWN]
        out[stem + UP] = _scaled_up(parts).to(parts[UP].dtype)
    for block, slots in fused.items():
        if set(slots) != set(QKV):
            raise AdapterKeyError(f"{block}: q, k and v are written as one fused qkv LoRA; "
                                  "adapt all three or none")
        pieces = [slots[name] for name in QKV]
        stem = f"{FILE_PREFIX}{block}.attention.qkv"
        out[stem + DOWN] = torch.cat([p[DOWN] for p in pieces], dim=0)
        out[stem + UP] = torch.block_diag(*[_scaled_up(p) for p in pieces]).to(
            pieces[0][UP].dtype)
    return dict(sorted(out.items()))


def _split_qkv(parts: Mapping[str, torch.Tensor], rows: tuple[int, int, int]
               ) -> list[dict[str, torch.Tensor]]:
    """A fused qkv LoRA -> q, k, v LoRAs with the same deltas: block-diagonal (what
    `to_file` writes) splits into rank thirds, anything else shares the whole down."""
    down, up = parts[DOWN], _scaled_up(parts)
    if up.shape[0] != sum(rows):
        raise AdapterKeyError(f"fused qkv LoRA has {up.shape[0]} output rows; this model's "
                              f"q, k, v have {rows}")
    bounds = [0, rows[0], rows[0] + rows[1], sum(rows)]
    rank = down.shape[0]
    if rank % 3 == 0:
        r = rank // 3
        blocks = [[up[bounds[i]:bounds[i + 1], j * r:(j + 1) * r] for j in range(3)]
                  for i in range(3)]
        if all(not blocks[i][j].any() for i in range(3) for j in range(3) if i != j):
            return [{DOWN: down[i * r:(i + 1) * r], UP: blocks[i][i].contiguous(),
                     ALPHA_SUFFIX: torch.tensor(float(r))} for i in range(3)]
    return [{DOWN: down.clone(), UP: up[bounds[i]:bounds[i + 1]].contiguous(),
             ALPHA_SUFFIX: torch.tensor(float(rank))} for i in range(3)]


def from_file(state_dict: Mapping[str, torch.Tensor], qkv_rows: tuple[int, int, int]
              ) -> dict[str, torch.Tensor]:
    """Any read layout -> internal names with an alpha for every LoRA module."""
    original = all(k.startswith(FILE_PREFIX) for k in state_dict) and any(
        mark in k for k in state_dict for mark in _ORIGINAL_MARKS)
    if not original:
        internal = from_public_keys(state_dict)
        if any(".lokr_" in k for k in internal):
            return internal
        return {module + suffix: value
                for module, parts in _modules(internal).items()
                for suffix, value in parts.items()}
    out: dict[str, torch.Tensor] = {}
    named = _modules({k[len(FILE_PREFIX):]: v for k, v in state_dict.items()})
    for module, parts in named.items():
        match = _BLOCK.match(module)
        rest = match[2] if match else ""
        if rest == "attention.qkv":
            for name, piece in zip(QKV, _split_qkv(parts, qkv_rows), strict=True):
                out.update({f"{match[1]}.{name}{s}": v for s, v in piece.items()})
        elif rest in _FROM_ORIGINAL:
            out.update({f"{match[1]}.{_FROM_ORIGINAL[rest]}{s}": v for s, v in parts.items()})
        else:
            raise AdapterKeyError(f"{FILE_PREFIX}{module!r} is not a Lumina 2 block layer "
                                  "aitk adapts")
    return out
