"""`python -m aitk audit adapter FILE`: is this LoRA/LoKr file sound, and who loads it?

Key layout (which arch it targets and which tools load that layout), rank and alpha per
module, NaN/Inf tensors, all-zero up/B tensors (a run that never trained, or a failed
save), per-block norms of the weight change, the metadata and the file's SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitk.errors import AdapterFileError
from aitk.findings import Finding, Report, error, info, warning

HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own cap on the JSON header

# (prefix or pattern, layout name, tools that load it)
LAYOUTS: tuple[tuple[str, str, str], ...] = (
    ("diffusion_model.", "ComfyUI / aitk (diffusion_model.<module>)",
     "ComfyUI, aitk"),
    ("transformer.", "diffusers (transformer.<module>)",
     "diffusers load_lora_weights, ComfyUI, aitk"),
    ("unet.", "diffusers UNet (unet.<module>)", "diffusers load_lora_weights, ComfyUI"),
    ("lora_unet_", "kohya (lora_unet_<module>)",
     "ComfyUI, A1111/Forge, kohya sd-scripts, diffusers (converted)"),
    ("lora_transformer_", "kohya (lora_transformer_<module>)", "ComfyUI, kohya sd-scripts"),
    ("lycoris_", "LyCORIS (lycoris_<module>)", "ComfyUI, LyCORIS"),
    ("base_model.model.", "peft (base_model.model.<module>)", "peft"),
)
UP_SUFFIXES = (".lora_B.weight", ".lora_up.weight", ".lokr_w2", ".lokr_w2_b", ".hada_w2_a")
DOWN_SUFFIXES = (".lora_A.weight", ".lora_down.weight")


@dataclass(frozen=True)
class Module:
    name: str
    rank: int | None
    alpha: float | None


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(tensor entries, metadata) from the safetensors header, without loading tensors."""
    try:
        with open(path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise AdapterFileError(f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", raw_len)
            if length > HEADER_LIMIT:
                raise AdapterFileError(f"{path}: header of {length} bytes is not plausible")
            header = json.loads(fh.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterFileError(f"{path}: not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise AdapterFileError(f"{path}: not a safetensors file")
    meta = header.pop("__metadata__", None) or {}
    return header, {str(k): str(v) for k, v in meta.items()}


def module_of(key: str) -> tuple[str, str]:
    """"x.lora_A.weight" -> ("x", ".lora_A.weight"); "x.alpha" -> ("x", ".alpha")."""
    for suffix in (*UP_SUFFIXES, *DOWN_SUFFIXES, ".alpha", ".lokr_w1", ".lokr_w1_a",
                   ".lokr_w1_b", ".lokr_w2_a", ".hada_w1_a", ".hada_w1_b", ".hada_w2_b"):
        if key.endswith(suffix):
            return key[: -len(suffix)], suffix
    return key, ""


def block_of(module: str) -> str:
    """The block a module belongs to: up to the first number ("x.blocks.3.attn" ->
    "x.blocks.3"), or the whole name."""
    found = re.search(r"^(.*?[._]\d+)(?:[._]|$)", module)
    return found.group(1) if found else module


def layout_of(keys: list[str]) -> tuple[str, str]:
    counts: Counter[tuple[str, str]] = Counter()
    for key in keys:
        for prefix, name, tools in LAYOUTS:
            if key.startswith(prefix):
                counts[(name, tools)] += 1
                break
        else:
            counts[("unknown (no known prefix)", "unknown")] += 1
    return counts.most_common(1)[0][0] if counts else ("empty", "none")


def archs_writing(keys: list[str]) -> list[str]:
    """The built-in archs whose LoRA layout (their description's `Lora.writes`: key
    prefix and key style) the file's keys have; the arch facts stay in the arch folders.
    A LoKr/LoHa key has no PEFT/kohya style, so its prefix alone decides."""
    from aitk.models.catalog import descriptions
    from aitk.models.description import KeyStyle

    styles = {".lora_A.weight": KeyStyle.PEFT, ".lora_B.weight": KeyStyle.PEFT,
              ".lora_down.weight": KeyStyle.KOHYA, ".lora_up.weight": KeyStyle.KOHYA}
    shapes = {(k, styles.get(module_of(k)[1])) for k in keys if not k.endswith(".alpha")}
    return [d.name for d in descriptions()
            if any(k.startswith(d.lora.writes.prefix) and style in (None, d.lora.writes.style)
                   for k, style in shapes)]


def _metadata_view(meta: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "config":
            out[key] = f"({len(value)} characters of JSON)"
            continue
        try:
            out[key] = json.loads(value) if value[:1] in "{[" else value
        except json.JSONDecodeError:
            out[key] = value
    return out


def audit_adapter(path: Path) -> Report:
    """Raises AdapterFileError when the file is not a safetensors file at all."""
    entries, meta = read_header(path)
    import torch
    from safetensors import safe_open

    report = Report("adapter", str(path))
    findings: list[Finding] = []
    keys = sorted(entries)
    layout, tools = layout_of([k for k in keys if not k.endswith(".alpha")])
    modules: dict[str, dict[str, Any]] = defaultdict(dict)
    with safe_open(str(path), framework="pt") as fh:
        for key in keys:
            tensor = fh.get_tensor(key).float()
            module, suffix = module_of(key)
            if not torch.isfinite(tensor).all():
                bad = int((~torch.isfinite(tensor)).sum())
                findings.append(error(key, f"{bad} NaN/Inf values", "retrain from a "
                                      "checkpoint before the loss diverged", "non_finite"))
            modules[module][suffix] = tensor
    ranks: Counter[int] = Counter()
    per_module: list[dict[str, Any]] = []
    block_norms: dict[str, float] = defaultdict(float)
    zero_up = 0
    up_total = 0
    for name, parts in sorted(modules.items()):
        down = next((parts[s] for s in DOWN_SUFFIXES if s in parts), None)
        up = next((parts[s] for s in UP_SUFFIXES if s in parts), None)
        alpha_t = parts.get(".alpha")
        rank = int(down.shape[0]) if down is not None and down.ndim >= 2 else None
        alpha = float(alpha_t.reshape(-1)[0]) if alpha_t is not None and alpha_t.numel() \
            else None
        if rank:
            ranks[rank] += 1
        if up is not None:
            up_total += 1
            if not bool((up != 0).any()):  # NaN is not zero: not `sum() > 0`
                zero_up += 1
        norm = None
        if up is not None and down is not None and up.ndim == 2 and down.ndim == 2:
            scale = (alpha / rank) if (alpha is not None and rank) else 1.0
            # ||B A||_F from the small r x r products, without forming B A
            gram = (up.T @ up) @ (down @ down.T)
            norm = float(torch.sqrt(torch.clamp(torch.trace(gram), min=0))) * abs(scale)
            block_norms[block_of(name)] += norm * norm
        per_module.append({"module": name, "rank": rank, "alpha": alpha, "norm": norm})
        if rank and alpha is None:
            findings.append(info(name, f"no alpha: loaders assume alpha = rank ({rank})",
                                 code="no_alpha"))
    if up_total and zero_up == up_total:
        findings.insert(0, error("", f"every up/B tensor ({up_total}) is all zeros: the "
                                 "adapter changes nothing (it never trained, or the save "
                                 "failed)", "check the training log; resume from a "
                                 "checkpoint", "all_zero"))
    elif zero_up:
        findings.append(warning("", f"{zero_up} of {up_total} up/B tensors are all zeros",
                                code="some_zero"))
    if len(ranks) > 1:
        findings.append(info("", f"mixed ranks {dict(ranks)}", code="mixed_ranks"))
    if layout.startswith("unknown"):
        findings.append(warning("", "key layout not recognised: loaders may ignore it",
                                code="unknown_layout"))
    if not meta:
        findings.append(info("", "no metadata", code="no_metadata"))
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    candidates = archs_writing(keys)
    norms = {b: round(v ** 0.5, 6) for b, v in sorted(block_norms.items())}
    report.summary = {
        "sha256": digest.hexdigest(), "tensors": len(keys), "modules": len(modules),
        "layout": layout, "loaded_by": tools,
        # the file's own word (aitk writes it), else the archs whose layout this is
        "arch": meta.get("base_model_arch") or (
            "one of " + ", ".join(candidates) if candidates else "unknown"),
        "archs_with_this_layout": candidates,
        "ranks": dict(ranks), "block_norms": norms,
        "metadata": _metadata_view(meta), "per_module": per_module,
    }
    report.findings = findings
    return report
