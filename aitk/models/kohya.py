"""Kohya's LoRA key layout, the one every tool of the UNet archs (SD 1.x, 2.x, XL) reads,
and its readers: aitk's internal (peft) names <-> the files other tools load.

Written, alpha included, in one file:

    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight
    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight
    lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.alpha
    lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight   (SD 1.x/2.x)
    lora_te1_... / lora_te2_...                                             (SDXL's two)

i.e. a prefix per part and the part's module path with `.` as `_`: diffusers' UNet names
after `lora_unet_`, transformers' CLIP names after a text encoder's prefix. ComfyUI maps
`lora_unet_` + diffusers names onto its UNet (comfy.utils.unet_to_diffusers) and the CLIP
encoder layers' `self_attn_{q,k,v,out}_proj` / `mlp_fc{1,2}` onto `clip_l` / `clip_h` /
`clip_g` (comfy.lora.model_lora_keys_clip); diffusers' `load_lora_weights` converts the
file and applies each `.alpha`; A1111/Forge read it natively.

Internal names (aitk.adapters.network): the UNet's module paths as they are, a text
encoder's under its part name (`text_encoder.text_model.encoder.layers.0...`), which is
also the `text_encoder.` / `text_encoder_2.` layout diffusers' `save_lora_weights` writes.

LoKr factors keep their names (`.lokr_w1`, `.lokr_w2_a`, ...) after the same module names,
the LyCORIS layout ComfyUI reads; so does DoRA's `.dora_scale` (aitk.adapters.network).
LoCon's conv layers are more modules of the same UNet blocks (`..._resnets_0_conv1`).

Read: kohya's layout; diffusers' (`unet.` / `text_encoder.` / `text_encoder_2.` + module
names, `lora_A`/`lora_B` or `lora_down`/`lora_up`; a module without `.alpha` has alpha =
rank, diffusers' reading); aitk's older `diffusion_model.` + UNet names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from aitk.adapters.keys import (
    ALPHA_SUFFIX,
    DORA_SUFFIX,
    PUBLIC_PREFIX,
    from_public_keys,
    module_of,
)
from aitk.errors import AdapterKeyError

UNET_PREFIX = "lora_unet_"
DIFFUSERS_UNET_PREFIX = "unet."
# What kohya (and upstream, ComfyUI's LORA_CLIP_MAP) trains of a CLIP text encoder: the
# Linear layers of its encoder layers (CLIPAttention's q/k/v/out_proj, CLIPMLP's fc1/fc2).
# transformers 5's CLIPTextModel holds them at `encoder.layers.` (it dropped the
# `text_model` wrapper), CLIPTextModelWithProjection still at `text_model.encoder.layers.`.
CLIP_LORA_PREFIXES = ("text_model.encoder.layers.", "encoder.layers.")
# The files name them as transformers 4 did, whatever is installed.
CLIP_ROOT = "text_model."

# LoKr factors keep peft's names, which are LyCORIS's (ComfyUI reads them so).
_LOKR = (".lokr_w1", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2", ".lokr_w2_a", ".lokr_w2_b",
         ".lokr_t2")
_SUFFIXES = {  # file suffix -> internal suffix
    ".lora_down.weight": ".lora_A.weight", ".lora_up.weight": ".lora_B.weight",
    ".lora_A.weight": ".lora_A.weight", ".lora_B.weight": ".lora_B.weight",
    ALPHA_SUFFIX: ALPHA_SUFFIX, DORA_SUFFIX: DORA_SUFFIX, **{s: s for s in _LOKR},
}
_TO_KOHYA = {".lora_A.weight": ".lora_down.weight", ".lora_B.weight": ".lora_up.weight",
             ALPHA_SUFFIX: ALPHA_SUFFIX, DORA_SUFFIX: DORA_SUFFIX,
             **{s: s for s in _LOKR}}


@dataclass(frozen=True)
class KohyaLayout:
    """One arch's kohya prefixes: the UNet's, and each text encoder's by its part
    (subfolder) name, e.g. SDXL's {"text_encoder": "lora_te1_", "text_encoder_2":
    "lora_te2_"}."""

    arch: str  # how error lines name the model ("SDXL")
    text_encoders: Mapping[str, str] = field(default_factory=dict)

    def prefix_of(self, internal_module: str) -> tuple[str, str]:
        """`text_encoder.encoder...q_proj` -> ("lora_te_", "text_model.encoder...q_proj");
        a UNet path -> ("lora_unet_", path)."""
        part, _, rest = internal_module.partition(".")
        if part in self.text_encoders and rest:
            return self.text_encoders[part], clip_name(rest)
        return UNET_PREFIX, internal_module


def clip_name(path: str) -> str:
    """A CLIP text encoder's module path as the files name it: `text_model.` first."""
    return path if path.startswith(CLIP_ROOT) else CLIP_ROOT + path


def _split(key: str) -> tuple[str, str]:
    """`a.b.lora_A.weight` -> (`a.b`, `.lora_A.weight`)."""
    for suffix in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], suffix
    raise AdapterKeyError(f"adapter key {key!r} is not a LoRA or LoKr weight or alpha "
                          "(lora_A/lora_B, lora_down/lora_up, lokr_w1/w2..., alpha)")


def to_kohya(state_dict: Mapping[str, torch.Tensor], layout: KohyaLayout
             ) -> dict[str, torch.Tensor]:
    """Internal names (LoRA weights + `<module>.alpha`) -> kohya names."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        module, suffix = _split(key)
        if suffix not in _TO_KOHYA:
            raise AdapterKeyError(f"{key!r}: only LoRA and LoKr weights have a kohya name")
        prefix, path = layout.prefix_of(module)
        out[prefix + path.replace(".", "_") + _TO_KOHYA[suffix]] = value
    return out


def _text_encoder_key(key: str, layout: KohyaLayout) -> tuple[str, str] | None:
    """(part, the rest of the key) when `key` is one of a text encoder's, in kohya's or
    diffusers' names; None otherwise."""
    for part, prefix in layout.text_encoders.items():
        for lead in (prefix, part + "."):
            if key.startswith(lead):
                return part, key[len(lead):]
    return None


def from_files(state_dict: Mapping[str, torch.Tensor], layout: KohyaLayout,
               unet_names: Iterable[str],
               text_encoder_names: Mapping[str, Iterable[str]] | None = None
               ) -> dict[str, torch.Tensor]:
    """Any of the read layouts -> internal names, with an alpha for every module.

    `unet_names`: the UNet's module paths; `text_encoder_names`: each trained text
    encoder's (by part). They resolve kohya's `_`-joined names (a `_` there may be a
    separator or part of a name such as `down_blocks`). A text encoder's key when none
    trains is an error: the file holds more than this network."""
    if any(k.startswith(PUBLIC_PREFIX) for k in state_dict):
        return from_public_keys(state_dict)
    # Each trained text encoder's paths by the name files give them (clip_name).
    encoders = {part: {clip_name(n): f"{part}.{n}" for n in names}
                for part, names in (text_encoder_names or {}).items()}
    by_kohya = {UNET_PREFIX: {n.replace(".", "_"): n for n in unet_names}}
    for part, names in encoders.items():
        by_kohya[layout.text_encoders[part]] = {n.replace(".", "_"): internal
                                                for n, internal in names.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        te = _text_encoder_key(key, layout)
        if te is not None:
            part, rest = te
            if part not in encoders:
                raise AdapterKeyError(
                    f"adapter key {key!r} is a text-encoder LoRA, and this run trains no "
                    f"{part} (train.train_text_encoder: true trains and loads one)")
            stem, suffix = _split(rest)
            module = (encoders[part].get(stem) if key.startswith(part + ".")  # diffusers
                      else by_kohya[layout.text_encoders[part]].get(stem))
            if module is None:
                raise AdapterKeyError(f"adapter key {key!r} names no layer of this {part}")
        elif key.startswith(UNET_PREFIX):
            stem, suffix = _split(key[len(UNET_PREFIX):])
            module = by_kohya[UNET_PREFIX].get(stem)
            if module is None:
                raise AdapterKeyError(f"adapter key {key!r} names no layer of this UNet")
        elif key.startswith(DIFFUSERS_UNET_PREFIX):
            module, suffix = _split(key[len(DIFFUSERS_UNET_PREFIX):])
        else:
            what = ("a text-encoder LoRA of another model" if key.startswith(
                ("lora_te", "text_encoder")) else "an unknown layout")
            known = [UNET_PREFIX, DIFFUSERS_UNET_PREFIX, PUBLIC_PREFIX,
                     *layout.text_encoders.values()]
            raise AdapterKeyError(
                f"adapter key {key!r} is {what}; {layout.arch} LoRA files use "
                f"{', '.join(repr(p) for p in known)} keys")
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
