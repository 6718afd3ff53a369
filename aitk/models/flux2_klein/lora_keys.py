"""FLUX.2 LoRA key layouts: aitk's internal (peft, diffusers module) names <-> files.

Written: kohya's layout over Black Forest Labs' module names, alpha included:

    lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight   (rank 3r: q, k, v fused)
    lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight     (block-diagonal)
    lora_unet_double_blocks_0_img_attn_qkv.alpha              (3 alpha: same alpha/rank)
    lora_unet_single_blocks_0_linear1.lora_down.weight ...

Why this one: ComfyUI runs FLUX.2 with BFL's module names and maps `lora_unet_` +
those names with `.alpha`; diffusers' `Flux2KleinPipeline.load_lora_weights` converts
this layout (splitting the fused qkv exactly, since the up matrix is block-diagonal) and
applies each alpha. The alternatives fail one side: upstream ai-toolkit's
`diffusion_model.` + BFL names is refused by diffusers as soon as it carries `.alpha`
keys, and `transformer.` + diffusers names (with alpha) is refused by diffusers and only
partly mapped by ComfyUI (its FLUX diffusers table has FLUX.1's MLP names).

diffusers splits BFL's fused double-block `qkv` into `to_q/to_k/to_v` (image stream) and
`add_q_proj/add_k_proj/add_v_proj` (text stream); three rank-r LoRAs are written as one
rank-3r LoRA: down = [A_q; A_k; A_v], up = diag(B_q, B_k, B_v), alpha scaled by 3, so
up @ down * alpha / rank is exactly the three deltas stacked.

Read: that layout; upstream's `diffusion_model.` + BFL names (lora_A/lora_B or
lora_down/lora_up; a fused qkv LoRA there shares its down matrix between q, k and v:
each gets the whole down and its third of the up, exact); and aitk's older
`diffusion_model.` / `transformer.` + diffusers names. A module without `.alpha` gets
alpha = rank, as diffusers reads it. LoKr weights (no exact fused form) keep aitk's
`diffusion_model.` + diffusers names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from aitk.adapters.keys import ALPHA_SUFFIX, from_public_keys, to_public_keys
from aitk.errors import AdapterKeyError

KOHYA_PREFIX = "lora_unet_"
BFL_PREFIX = "diffusion_model."
DOWN, UP = ".lora_A.weight", ".lora_B.weight"
_KOHYA_SUFFIX = {DOWN: ".lora_down.weight", UP: ".lora_up.weight", ALPHA_SUFFIX: ALPHA_SUFFIX}
_READ_SUFFIX = {".lora_down.weight": DOWN, ".lora_up.weight": UP, DOWN: DOWN, UP: UP,
                ALPHA_SUFFIX: ALPHA_SUFFIX}

# Inside a double block: diffusers module -> (BFL module, slot in a fused qkv or None).
DOUBLE = {
    "attn.to_q": ("img_attn.qkv", 0), "attn.to_k": ("img_attn.qkv", 1),
    "attn.to_v": ("img_attn.qkv", 2),
    "attn.add_q_proj": ("txt_attn.qkv", 0), "attn.add_k_proj": ("txt_attn.qkv", 1),
    "attn.add_v_proj": ("txt_attn.qkv", 2),
    "attn.to_out.0": ("img_attn.proj", None), "attn.to_add_out": ("txt_attn.proj", None),
    "ff.linear_in": ("img_mlp.0", None), "ff.linear_out": ("img_mlp.2", None),
    "ff_context.linear_in": ("txt_mlp.0", None), "ff_context.linear_out": ("txt_mlp.2", None),
}
SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
_DOUBLE_FROM_BFL: dict[str, list[str]] = {}
for _diff, (_bfl, _slot) in DOUBLE.items():
    _DOUBLE_FROM_BFL.setdefault(_bfl, []).append(_diff)
_SINGLE_FROM_BFL = {v: k for k, v in SINGLE.items()}
_DIFFUSERS_MODULE = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")
_BFL_MODULE = re.compile(r"^(double_blocks|single_blocks)\.(\d+)\.(.+)$")
_KOHYA_MODULE = re.compile(r"^(double|single)_blocks_(\d+)_(.+)$")


def _split(key: str) -> tuple[str, str]:
    for suffix in _READ_SUFFIX:
        if key.endswith(suffix):
            return key[: -len(suffix)], _READ_SUFFIX[suffix]
    raise AdapterKeyError(f"adapter key {key!r} is not a LoRA weight or alpha "
                          "(lora_A/lora_B, lora_down/lora_up, alpha)")


def _by_module(state_dict: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{module: {suffix: tensor}}, an alpha = rank added where the file has none."""
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        module, suffix = _split(key)
        modules.setdefault(module, {})[suffix] = value
    for module, parts in modules.items():
        if DOWN not in parts or UP not in parts:
            raise AdapterKeyError(f"LoRA module {module!r} lacks its down or up weight")
        parts.setdefault(ALPHA_SUFFIX, torch.tensor(float(parts[DOWN].shape[0])))
    return modules


def _to_bfl(module: str) -> tuple[str, int | None]:
    match = _DIFFUSERS_MODULE.match(module)
    table = (DOUBLE if match and match[1] == "transformer_blocks"
             else {k: (v, None) for k, v in SINGLE.items()})
    if match is None or match[3] not in table:
        raise AdapterKeyError(f"{module!r} is not a FLUX.2 block layer with a BFL name")
    bfl, slot = table[match[3]]
    kind = "double_blocks" if match[1] == "transformer_blocks" else "single_blocks"
    return f"{kind}.{match[2]}.{bfl}", slot


def _fuse(slots: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Three LoRAs (q, k, v) -> one with stacked down, block-diagonal up, same scale."""
    ranks = [p[DOWN].shape[0] for p in slots]
    scales = [float(p[ALPHA_SUFFIX]) / r for p, r in zip(slots, ranks, strict=True)]
    down = torch.cat([p[DOWN] for p in slots], dim=0)
    ups = [p[UP] * (s / scales[0]) for p, s in zip(slots, scales, strict=True)]
    up = torch.block_diag(*ups).to(slots[0][UP].dtype)
    return {DOWN: down, UP: up,
            ALPHA_SUFFIX: torch.tensor(scales[0] * sum(ranks), dtype=torch.float32)}


def to_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (LoRA weights + `<module>.alpha`) -> kohya names over BFL modules;
    LoKr weights keep aitk's `diffusion_model.` layout."""
    if any(".lokr_" in k for k in state_dict):
        return to_public_keys(state_dict)
    fused: dict[str, list[dict[str, torch.Tensor] | None]] = {}
    plain: dict[str, dict[str, torch.Tensor]] = {}
    for module, parts in _by_module(state_dict).items():
        bfl, slot = _to_bfl(module)
        if slot is None:
            plain[bfl] = parts
        else:
            fused.setdefault(bfl, [None, None, None])[slot] = parts
    for bfl, slots in fused.items():
        if any(s is None for s in slots):
            raise AdapterKeyError(f"{bfl}: a LoRA on q, k and v is written as one fused "
                                  "qkv LoRA; adapt all three or none")
        plain[bfl] = _fuse([s for s in slots if s is not None])
    out: dict[str, torch.Tensor] = {}
    for bfl, parts in sorted(plain.items()):
        stem = KOHYA_PREFIX + bfl.replace(".", "_")
        for suffix, value in parts.items():
            out[stem + _KOHYA_SUFFIX[suffix]] = value
    return out


def _split_fused(parts: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """A fused qkv LoRA -> three exact LoRAs: block-diagonal (what `to_file` writes) is
    split into rank thirds, anything else shares the whole down matrix."""
    down, up, alpha = parts[DOWN], parts[UP], float(parts[ALPHA_SUFFIX])
    rank, rows = down.shape[0], up.shape[0] // 3
    scale = alpha / rank
    if rank % 3 == 0:
        r = rank // 3
        blocks = [[up[i * rows:(i + 1) * rows, j * r:(j + 1) * r] for j in range(3)]
                  for i in range(3)]
        if all(not blocks[i][j].any() for i in range(3) for j in range(3) if i != j):
            return [{DOWN: down[i * r:(i + 1) * r], UP: blocks[i][i].contiguous(),
                     ALPHA_SUFFIX: torch.tensor(scale * r)} for i in range(3)]
    return [{DOWN: down.clone(), UP: up[i * rows:(i + 1) * rows].contiguous(),
             ALPHA_SUFFIX: torch.tensor(alpha)} for i in range(3)]


def _from_bfl_modules(modules: Mapping[str, Mapping[str, torch.Tensor]]
                      ) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}

    def put(module: str, parts: Mapping[str, torch.Tensor]) -> None:
        for suffix, value in parts.items():
            out[module + suffix] = value

    for bfl, parts in modules.items():
        match = _BFL_MODULE.match(bfl)
        if match is None:
            raise AdapterKeyError(f"{bfl!r} is not a FLUX.2 double or single block layer")
        kind, index, rest = match[1], match[2], match[3]
        if kind == "single_blocks" and rest in _SINGLE_FROM_BFL:
            put(f"single_transformer_blocks.{index}.{_SINGLE_FROM_BFL[rest]}", parts)
        elif kind == "double_blocks" and rest in _DOUBLE_FROM_BFL:
            names = _DOUBLE_FROM_BFL[rest]
            pieces = _split_fused(parts) if len(names) == 3 else [dict(parts)]
            for name, piece in zip(names, pieces, strict=True):
                put(f"transformer_blocks.{index}.{name}", piece)
        else:
            raise AdapterKeyError(f"{bfl!r} is not a FLUX.2 block layer aitk adapts")
    return out


def _kohya_to_bfl(stem: str) -> str:
    match = _KOHYA_MODULE.match(stem)
    if match is None:
        raise AdapterKeyError(f"{KOHYA_PREFIX}{stem!r} is not a FLUX.2 block layer")
    kind, index, rest = match[1], match[2], match[3]
    known = _SINGLE_FROM_BFL if kind == "single" else _DOUBLE_FROM_BFL
    for bfl in known:
        if bfl.replace(".", "_") == rest:
            return f"{kind}_blocks.{index}.{bfl}"
    raise AdapterKeyError(f"{KOHYA_PREFIX}{stem!r} is not a FLUX.2 block layer aitk adapts")


def from_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any read layout -> internal names, with an alpha for every LoRA module."""
    if any(k.startswith(KOHYA_PREFIX) for k in state_dict):
        bad = [k for k in state_dict if not k.startswith(KOHYA_PREFIX)]
        if bad:
            raise AdapterKeyError(f"adapter key {bad[0]!r} mixes layouts with {KOHYA_PREFIX}")
        modules = _by_module({k[len(KOHYA_PREFIX):]: v for k, v in state_dict.items()})
        return _from_bfl_modules({_kohya_to_bfl(stem): parts
                                  for stem, parts in modules.items()})
    if all(k.startswith(BFL_PREFIX) for k in state_dict):
        stripped = {k[len(BFL_PREFIX):]: v for k, v in state_dict.items()}
        if any(_BFL_MODULE.match(k) for k in stripped) and not any(
                ".lokr_" in k for k in stripped):
            return _from_bfl_modules(_by_module(stripped))
    return from_public_keys(state_dict)
