"""Adapter key names: the public file convention <-> peft's internal names.

Internal names are what peft's `get_peft_model_state_dict` returns for the module the
adapter is attached to (the adapter name removed):

    blocks.0.attn.to_q.lora_A.weight      (LoRA down, shape (rank, in))
    blocks.0.attn.to_q.lora_B.weight      (LoRA up, shape (out, rank))
    blocks.0.attn.to_q.lokr_w1            (LoKr factors: lokr_w1 | lokr_w1_a + lokr_w1_b,
    blocks.0.attn.to_q.lokr_w2             lokr_w2 | lokr_w2_a + lokr_w2_b [+ lokr_t2])

Public names, written to LoRA files, are the internal names with the ComfyUI-style
`diffusion_model.` prefix, plus one scalar `<module>.alpha` per adapted module so that
other tools apply the trained scale (`alpha / rank`):

    diffusion_model.blocks.0.attn.to_q.lora_A.weight
    diffusion_model.blocks.0.attn.to_q.lora_B.weight
    diffusion_model.blocks.0.attn.to_q.alpha

Reading also accepts the `transformer.` prefix (diffusers) and kohya-style
`lora_down.weight` / `lora_up.weight` suffixes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from aitk.errors import AdapterKeyError

PUBLIC_PREFIX = "diffusion_model."
_READ_PREFIXES = (PUBLIC_PREFIX, "transformer.")
_SUFFIX_ALIASES = {".lora_down.weight": ".lora_A.weight", ".lora_up.weight": ".lora_B.weight"}
ALPHA_SUFFIX = ".alpha"
# DoRA's per-output-channel magnitude: peft's internal name (shape (out,), or
# (1, out, 1, 1) for a Conv2d) and the file name kohya, LyCORIS and ComfyUI use
# (shape (out, 1) / (out, 1, 1, 1): one value per output row of the weight).
MAGNITUDE_SUFFIX = ".lora_magnitude_vector"
DORA_SUFFIX = ".dora_scale"


def to_public_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal names (with optional `<module>.alpha` entries) -> public names."""
    return {PUBLIC_PREFIX + key: value for key, value in state_dict.items()}


def from_public_keys(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public names -> internal names; the inverse of `to_public_keys`."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        prefix = next((p for p in _READ_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            raise AdapterKeyError(
                f"adapter key {key!r} lacks the {PUBLIC_PREFIX!r} prefix; this file was not "
                f"written for a diffusion transformer in the public convention")
        name = key[len(prefix):]
        for alias, internal in _SUFFIX_ALIASES.items():
            if name.endswith(alias):
                name = name[: -len(alias)] + internal
        if name in out:
            raise AdapterKeyError(f"adapter key {key!r} duplicates {name!r}")
        out[name] = value
    return out


def split_alphas(state_dict: Mapping[str, torch.Tensor]
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Internal names -> (weights, {module path: alpha})."""
    weights: dict[str, torch.Tensor] = {}
    alphas: dict[str, float] = {}
    for key, value in state_dict.items():
        if key.endswith(ALPHA_SUFFIX):
            alphas[key[: -len(ALPHA_SUFFIX)]] = float(value)
        else:
            weights[key] = value
    return weights, alphas


def module_of(key: str) -> str:
    """`blocks.0.attn.to_q.lora_A.weight` -> `blocks.0.attn.to_q`."""
    if key.endswith(DORA_SUFFIX):
        return key[: -len(DORA_SUFFIX)]
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.startswith(("lora_", "lokr_")):
            return ".".join(parts[:i])
    raise AdapterKeyError(f"{key!r} is not an adapter weight (no lora_/lokr_ part)")
