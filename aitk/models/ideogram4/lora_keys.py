"""Ideogram 4 LoRA key layouts: aitk's internal (peft, diffusers module) names <-> files.

Written: `diffusion_model.` + Ideogram's original module names (upstream ai-toolkit's
layout, the reference checkpoint's names), lora_A / lora_B, no `.alpha` keys:

    diffusion_model.layers.0.attention.qkv.lora_A.weight   (diffusers to_q, to_k, to_v)
    diffusion_model.layers.0.attention.o.lora_B.weight     (diffusers attention.to_out.0)
    diffusion_model.layers.0.feed_forward.w1.lora_A.weight (the same name in both)
    diffusion_model.layers.0.adaln_modulation.lora_B.weight

The original model has one fused `qkv` Linear where diffusers has three. aitk trains
three LoRAs (rank r each) and writes them as one fused LoRA of rank 3r that is exactly
their sum: the down weight stacks the three downs, the up weight is block-diagonal
(the q rows use only the q down's r rows, and so on). diffusers'
Ideogram4Pipeline.load_lora_weights converts the layout
(`_convert_non_diffusers_ideogram4_lora_to_diffusers`): it gives each of to_q / to_k /
to_v the whole stacked down and its third of the up, so each gets exactly its own delta
back (rank 3r, alpha = rank without `.alpha` keys, so the scale is 1). alpha / rank is
folded into each up weight before fusing for that reason. A member of q / k / v that
was not trained is written as zeros (same rank as the others).

Read: that layout; upstream's own files (one shared down for q, k and v, rank r, with
`.alpha`), told apart from aitk's by the block structure (see `_split_qkv`); kohya's
lora_down / lora_up suffixes; and diffusers names under `transformer.` or
`diffusion_model.`. LoKr weights (whose factors have no one up matrix to fold into)
keep aitk's `diffusion_model.` + diffusers names with alpha.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from aitk.adapters.keys import ALPHA_SUFFIX, from_public_keys, to_public_keys
from aitk.errors import AdapterKeyError

PREFIX = "diffusion_model."
DOWN, UP = ".lora_A.weight", ".lora_B.weight"
_SUFFIXES = {DOWN: DOWN, UP: UP, ".lora_down.weight": DOWN, ".lora_up.weight": UP,
             ALPHA_SUFFIX: ALPHA_SUFFIX}
QKV = ("to_q", "to_k", "to_v")
# Inside a block, diffusers' module -> Ideogram's (feed_forward.w*, adaln_modulation:
# the same in both).
RENAMED = {"attention.to_out.0": "attention.o"}
_BLOCK = re.compile(r"^layers\.(\d+)\.(.+)$")
_FUSED = re.compile(r"^layers\.(\d+)\.attention\.qkv$")


def _split(key: str) -> tuple[str, str]:
    for suffix, internal in _SUFFIXES.items():
        if key.endswith(suffix):
            return key[: -len(suffix)], internal
    raise AdapterKeyError(f"adapter key {key!r} is not a LoRA weight or alpha "
                          "(lora_A/lora_B, lora_down/lora_up, alpha)")


def _modules(state_dict: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """module path -> {suffix: tensor}."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        module, suffix = _split(key)
        if suffix in out.setdefault(module, {}):
            raise AdapterKeyError(f"adapter key {key!r} duplicates another for {module!r}")
        out[module][suffix] = value
    return out


def _folded_up(weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
    up = weights[UP]
    alpha = weights.get(ALPHA_SUFFIX)
    rank = up.shape[1]
    return up * (float(alpha) / rank) if alpha is not None and float(alpha) != rank else up


def _original(module: str) -> str:
    match = _BLOCK.match(module)
    if match is None:
        raise AdapterKeyError(f"{module!r} is not an Ideogram 4 transformer-block layer "
                              "(LoRA files of this arch cover `layers.N.` only)")
    inner = match[2]
    return f"layers.{match[1]}.{RENAMED.get(inner, inner)}"


def to_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (LoRA weights + `<module>.alpha`) -> `diffusion_model.` + Ideogram's
    names, alpha folded into the up weights, q / k / v fused block-diagonally."""
    if any(".lokr_" in k for k in state_dict):
        return to_public_keys(state_dict)
    modules = _modules(state_dict)
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for module, weights in modules.items():
        head, _, last = module.rpartition(".")
        if head.endswith(".attention") and last in QKV:
            fused.setdefault(head, {})[last] = weights
            continue
        out[f"{PREFIX}{_original(module)}{DOWN}"] = weights[DOWN]
        out[f"{PREFIX}{_original(module)}{UP}"] = _folded_up(weights)
    for attention, members in fused.items():
        down, up = _fuse(attention, members)
        out[f"{PREFIX}{_original(attention + '.qkv')}{DOWN}"] = down
        out[f"{PREFIX}{_original(attention + '.qkv')}{UP}"] = up
    return out


def _fuse(attention: str, members: Mapping[str, Mapping[str, torch.Tensor]]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank-3r fused qkv LoRA whose delta is the three members' (zeros for one
    that is absent)."""
    ranks = {m[DOWN].shape[0] for m in members.values()}
    if len(ranks) != 1:
        raise AdapterKeyError(f"{attention}: to_q / to_k / to_v LoRAs of different ranks "
                              f"({sorted(ranks)}) cannot be written as Ideogram's fused qkv")
    [rank] = ranks
    some = next(iter(members.values()))
    features, out_features = some[DOWN].shape[1], some[UP].shape[0]
    like = some[DOWN]
    downs, ups = [], []
    for name in QKV:
        weights = members.get(name)
        if weights is None:
            downs.append(like.new_zeros(rank, features))
            ups.append(like.new_zeros(out_features, rank))
        else:
            downs.append(weights[DOWN])
            ups.append(_folded_up(weights).to(like.dtype))
    return torch.cat(downs), torch.block_diag(*ups)


def _split_qkv(layer: str, weights: Mapping[str, torch.Tensor], other_rank: int | None
               ) -> dict[str, dict[str, torch.Tensor]]:
    """A fused qkv LoRA -> to_q / to_k / to_v. aitk's own (block-diagonal up, rank 3r):
    each member gets its r rows back (an all-zero member, one aitk filled in, is
    dropped). Upstream's (a shared down of rank r): each member gets the whole down and
    its third of the up. Told apart by the up's off-diagonal blocks being exactly zero
    and, where the layer has `attention.o`, by o's rank (r in both layouts)."""
    down, up = weights[DOWN], weights[UP]
    rank, out3 = down.shape[0], up.shape[0]
    if out3 % 3:
        raise AdapterKeyError(f"{layer}.attention.qkv: up weight of {out3} rows is not "
                              "three equal projections")
    out = out3 // 3
    alpha = weights.get(ALPHA_SUFFIX)
    block_diagonal = rank % 3 == 0 and (other_rank is None or other_rank == rank // 3)
    if block_diagonal:
        r = rank // 3
        mask = torch.block_diag(*[torch.ones(out, r, dtype=torch.bool)] * 3)
        block_diagonal = not bool(up[~mask].any())
    members: dict[str, dict[str, torch.Tensor]] = {}
    for i, name in enumerate(QKV):
        rows = slice(i * out, (i + 1) * out)
        if block_diagonal:
            cols = slice(i * r, (i + 1) * r)
            member = {DOWN: down[cols].contiguous(), UP: up[rows, cols].contiguous()}
            if not member[DOWN].any() and not member[UP].any():
                continue
            if alpha is not None:  # the same scale alpha / rank at a third of the rank
                member[ALPHA_SUFFIX] = torch.tensor(float(alpha) / 3)
        else:
            member = {DOWN: down.clone(), UP: up[rows].contiguous()}
            if alpha is not None:
                member[ALPHA_SUFFIX] = alpha
        members[f"{layer}.attention.{name}"] = member
    return members


def from_file(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any read layout -> internal names, with an alpha for every LoRA module (rank
    where the file has none: what a folded file means)."""
    if any(".lokr_" in k for k in state_dict):
        return from_public_keys(state_dict)
    stripped = {}
    for key, value in state_dict.items():
        for prefix in (PREFIX, "transformer."):
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        stripped[key] = value
    modules = _modules(stripped)
    internal: dict[str, dict[str, torch.Tensor]] = {}
    for module, weights in modules.items():
        if DOWN not in weights or UP not in weights:
            raise AdapterKeyError(f"{module!r}: a LoRA needs both its down and up weights")
        fused = _FUSED.match(module)
        if fused:
            layer = f"layers.{fused[1]}"
            o = modules.get(f"{layer}.attention.o", modules.get(f"{layer}.attention.to_out.0"))
            members = _split_qkv(layer, weights, None if o is None else o[DOWN].shape[0])
        else:
            name = module.replace(".attention.o", ".attention.to_out.0") \
                if module.endswith(".attention.o") else module
            members = {name: dict(weights)}
        for name, member in members.items():
            if name in internal:
                raise AdapterKeyError(f"adapter module {module!r} duplicates {name!r}")
            internal[name] = member
    out: dict[str, torch.Tensor] = {}
    for name, member in internal.items():
        out[name + DOWN], out[name + UP] = member[DOWN], member[UP]
        out[name + ALPHA_SUFFIX] = member.get(ALPHA_SUFFIX,
                                              torch.tensor(float(member[DOWN].shape[0])))
    return out
