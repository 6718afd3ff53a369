"""Load a model part and quantize it block by block while its weights are read, so the
full-precision model never exists as a whole (peak RAM ≈ the quantized model plus one
block in full precision).

`from_pretrained` followed by quantization holds every float weight at once: a 20B
transformer needs 40 GB of RAM in bf16 before quanto can shrink it to 10, which is what
upstream users hit as "RAM spikes past 120 GB while loading". Here instead:

1. the part is built from its config with its parameters on the meta device
   (accelerate's `init_empty_weights`; buffers stay real, so rotary tables computed in
   `__init__` survive);
2. the `.safetensors` files are indexed by key (headers only);
3. for each quantization unit (aitk.models.quantize.quantization_units: each block of a
   block list, each other child), its tensors are read, cast to the part's dtype (the
   class's `_keep_in_fp32_modules` stay float32, as `from_pretrained` keeps them), set in
   place, and its Linear layers quantized before the next unit is read.

Where that cannot be done the same way `from_pretrained` would do it (no safetensors
files, a `variant`, weight names the model does not have, a file that misses a weight
that is not tied to another), it falls back to `load_part` followed by quantization,
with the same result and the old peak. A hub id is resolved to its local snapshot first.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aitk.errors import ModelLoadError
from aitk.models.loading import load_part
from aitk.models.qtypes import QType
from aitk.models.quantize import (
    quantization_units,
    quantize_linear_layers,
    quantize_unit,
    release_freed_memory,
    resolve_per_layer,
    resolve_qtype,
)


def load_part_quantized(cls: Any, name_or_path: str, subfolder: str, arch: str,
                        qtype: str, exclude: Sequence[str] = (),
                        progress: Callable[[str], None] | None = None,
                        per_layer: Mapping[str, str] | None = None,
                        **kwargs: Any) -> nn.Module:
    """`load_part(cls, ...)` with its Linear layers quantized to `qtype` (except the
    `exclude` fnmatch patterns; `per_layer`: other qtypes for some layers), quantizing
    each block as soon as it is read."""
    folder = _local_folder(name_or_path, subfolder)
    dtype = kwargs.get("torch_dtype", kwargs.get("dtype"))
    plan = None
    if folder is not None and set(kwargs) <= {"torch_dtype", "dtype"}:
        plan = _plan(cls, folder)
    if plan is None:  # the library's own loading, then quantization
        module = load_part(cls, name_or_path, subfolder, arch, **kwargs)
        return quantize_linear_layers(module, qtype, exclude=exclude, progress=progress,
                                      per_layer=per_layer)
    model, files = plan
    kind = resolve_qtype(qtype)
    try:
        return _load_blockwise(model, files, kind, resolve_per_layer(per_layer), dtype,
                               exclude, progress)
    except (OSError, ValueError, KeyError, safetensors_error()) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"cannot load the {arch} model's {subfolder}/ from {folder}: "
                             f"{detail}; check the folder") from None


def safetensors_error() -> type[Exception]:
    from safetensors import SafetensorError

    return SafetensorError


def _load_blockwise(model: nn.Module, files: dict[str, Path], kind: QType,
                    kinds: dict[str, QType], dtype: torch.dtype | None, exclude: Sequence[str],
                    progress: Callable[[str], None] | None) -> nn.Module:
    keep_fp32 = _kept_in_float32(model, dtype)
    names = _tensor_names(model)
    units = quantization_units(model)
    owner = _owners(names, [name for name, _ in units])
    # What belongs to no unit (root parameters, say) first, then unit after unit.
    _read(model, files, owner.pop(None, []), dtype, keep_fp32)
    for name, unit in units:
        _read(model, files, owner.pop(name, []), dtype, keep_fp32)
        quantize_unit(model, name, unit, kind, exclude, kinds=kinds)
        release_freed_memory()
        if progress is not None:
            progress(name)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    still = [n for n, p in model.named_parameters() if p.is_meta]
    if still:  # _plan checked the names, so this is a broken file or a bug
        raise ValueError(f"no weight for {still[0]}")
    model.eval()
    return model


def _local_folder(name_or_path: str, subfolder: str) -> Path | None:
    """The part's folder on this machine: under a local model folder, or in the hub
    cache for a hub id (None when it is not there: load_part then says why)."""
    root = Path(name_or_path).expanduser()
    if root.is_dir():
        return root / subfolder if (root / subfolder).is_dir() else None
    if root.exists():
        return None
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(name_or_path, allow_patterns=[f"{subfolder}/*"]))
    except Exception:  # offline, gated, unknown: load_part turns it into one line
        return None
    return snap / subfolder if (snap / subfolder).is_dir() else None


def _plan(cls: Any, folder: Path) -> tuple[nn.Module, dict[str, Path]] | None:
    """The part built on the meta device and its weights file per tensor name, or None
    where block-wise loading would not give what `from_pretrained` gives."""
    from accelerate import init_empty_weights
    from safetensors import safe_open

    files: dict[str, Path] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            files.update(dict.fromkeys(handle.keys(), path))
    if not files or not _one_set_of_files(folder):
        return None
    with init_empty_weights(include_buffers=False):
        model = _from_config(cls, folder)
    if model is None:
        return None
    tie = getattr(model, "tie_weights", None)
    if callable(tie):  # transformers ties embeddings in from_pretrained, not here
        tie()
    names = _tensor_names(model)
    expected = set(names) | {n for n, _ in model.named_buffers() if n in files}
    if set(files) - expected:  # a renamed layout the library converts while loading
        return None
    groups = _tied_groups(model)
    for name in names:
        if name not in files and not any(other in files for other in groups.get(name, ())):
            return None
    return model, files


def _one_set_of_files(folder: Path) -> bool:
    """True unless the folder holds variants (fp16 and fp32 copies) side by side: with a
    shard index, every file is one of its shards."""
    indexes = list(folder.glob("*.safetensors.index.json"))
    shards = {p.name for p in folder.glob("*.safetensors")}
    if len(indexes) > 1:
        return False
    if indexes:
        listed = set(json.loads(indexes[0].read_text()).get("weight_map", {}).values())
        return shards == listed
    return len(shards) == 1


def _from_config(cls: Any, folder: Path) -> nn.Module | None:
    """The part's class built from the folder's config (diffusers or transformers)."""
    try:
        if hasattr(cls, "load_config"):  # diffusers ModelMixin
            return cls.from_config(cls.load_config(folder))
        config = cls.config_class.from_pretrained(folder)
        return cls._from_config(config)
    except Exception:  # an unusual config: the library's own loading will say
        return None


def _kept_in_float32(model: nn.Module, dtype: torch.dtype | None) -> tuple[str, ...]:
    """The modules `from_pretrained` would keep in float32 at `dtype`: diffusers keeps
    `_keep_in_fp32_modules` at any dtype, transformers only at float16 (and its
    `_strict` list at bfloat16 too)."""
    if hasattr(model, "load_config"):
        return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    keep = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ()) \
        if dtype in (torch.float16, torch.bfloat16) else []
    if dtype == torch.float16:
        keep += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    return tuple(keep)


def _tensor_names(model: nn.Module) -> list[str]:
    """Names of the parameters and persistent buffers a weights file holds."""
    return list(model.state_dict(keep_vars=True))


def _tied_groups(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each parameter name -> every name of the same tensor (tied embeddings)."""
    by_id: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id[id(param)].append(name)
    return {name: tuple(group) for group in by_id.values() for name in group}


def _owners(names: list[str], units: list[str]) -> dict[str | None, list[str]]:
    """Tensor names grouped by the unit whose name prefixes them (None: no unit)."""
    owner: dict[str | None, list[str]] = defaultdict(list)
    for name in names:
        unit = next((u for u in units if name.startswith(u + ".")), None)
        owner[unit].append(name)
    return owner


def _read(model: nn.Module, files: dict[str, Path], names: list[str],
          dtype: torch.dtype | None, keep_fp32: tuple[str, ...]) -> None:
    from safetensors import safe_open

    for name in names:
        if name not in files:
            continue
        # The file is mapped for one tensor at a time and the tensor copied out of the
        # mapping: its pages count in RSS for as long as it is mapped, so reading a
        # whole block through one mapping would add that block's size to the peak again.
        with safe_open(str(files[name]), framework="pt") as handle:
            value = handle.get_tensor(name)
            target = value.dtype
            if dtype is not None and value.is_floating_point():
                fp32 = any(part in keep_fp32 for part in name.split("."))
                target = torch.float32 if fp32 else dtype
            _set_tensor(model, name, value.to(target, copy=True))
            del value


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if leaf in parent._parameters:
        parent._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        parent._buffers[leaf] = value
