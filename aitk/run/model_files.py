"""A whole model's weights as the files other tools load (a full fine-tune's outputs, a
LoRA merged into a model):

    save_format: diffusers     NAME/ as a diffusers pipeline folder: the denoiser part(s)
                               (and text encoders, when trained) written from the
                               weights in memory, sharded at MAX_SHARD_SIZE, every other
                               part taken from the source model (hard-linked when on the
                               same disk, else copied), MODEL_MARKER listing it all
    save_format: safetensors   NAME.safetensors: the denoiser's state dict in diffusers
                               names (ComfyUI's diffusion-model loader converts these for
                               SDXL, SD3 and Flux), metadata naming aitk; a model with
                               several denoiser parts (Wan 2.2's experts) writes one file
                               per part, the later ones as NAME_<part>.safetensors

Both are published atomically (a staged folder renamed into place; a temp file renamed)
and carry aitk's mark, so pruning removes only what aitk wrote (aitk.run.ownership).
Weights are cast to the save dtype on the way out; the model in memory is not touched.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aitk.run.ownership import MODEL_MARKER
from aitk_common.files import atomic_write_json, atomic_write_with, staged_dir

MAX_SHARD_SIZE = "5GB"  # what diffusers' and the hub's own uploads use


def state_dict_as(module: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The module's tensors on the CPU, floating ones in `dtype` (the module unchanged)."""
    out = {}
    for key, value in module.state_dict().items():
        value = value.detach()
        if value.is_floating_point():
            value = value.to(dtype)
        out[key] = value.to("cpu").contiguous()
    return out


def write_part(module: nn.Module, folder: Path, dtype: torch.dtype,
               max_shard_size: str = MAX_SHARD_SIZE) -> None:
    """One part as its library's `from_pretrained` reads it: config + safetensors
    shards (+ index). diffusers models write `diffusion_pytorch_model*.safetensors`,
    transformers models `model*.safetensors`."""
    from huggingface_hub import save_torch_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(module, "save_config"):  # diffusers ModelMixin / ConfigMixin
        module.save_config(folder)
        pattern = "diffusion_pytorch_model{suffix}.safetensors"
    elif hasattr(module, "config") and hasattr(module.config, "save_pretrained"):
        module.config.save_pretrained(folder)  # transformers
        pattern = "model{suffix}.safetensors"
    else:
        raise TypeError(f"{type(module).__name__} is neither a diffusers nor a "
                        "transformers model: no folder layout to save it in")
    save_torch_state_dict(state_dict_as(module, dtype), folder, filename_pattern=pattern,
                          max_shard_size=max_shard_size, metadata={"format": "pt"})


def source_folder(name_or_path: str) -> Path | None:
    """The model's files on disk: its folder, or its hub snapshot in the local cache
    (where loading put it); None for a single file or nothing cached."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, local_files_only=True))
    except Exception:  # not a hub id, or not cached: the caller says what it lacks
        return None


def _link_or_copy(src: Path, dst: Path) -> None:
    """A source file into the output: a hard link on the same disk (no space, no time),
    else a copy. Hub caches link their files to blobs: the blob is what is taken."""
    src = src.resolve()
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _copy_tree(src: Path, dst: Path, skip: set[str]) -> None:
    for entry in sorted(src.iterdir()):
        if entry.name in skip or entry.name.startswith("."):
            continue
        if entry.is_dir():
            for file in sorted(p for p in entry.rglob("*") if p.is_file()):
                _link_or_copy(file, dst / file.relative_to(src))
        elif entry.is_file():
            _link_or_copy(entry, dst / entry.name)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def write_diffusers(target: Path, parts: Mapping[str, nn.Module], source: str,
                    dtype: torch.dtype, record: Mapping[str, Any]) -> None:
    """`target` as a diffusers folder: `parts` (subfolder -> module) from memory, the
    rest of the source model's folder beside them, then the marker (last: a folder
    without it is not ours)."""
    folder = source_folder(source)
    with staged_dir(target) as tmp:
        for sub, module in parts.items():
            write_part(module, tmp / sub, dtype)
        if folder is not None:
            _copy_tree(folder, tmp, skip=set(parts) | {MODEL_MARKER})
        atomic_write_json(tmp / MODEL_MARKER, {**record, "files": _files(tmp)})


def single_file_paths(target: Path, parts: Mapping[str, nn.Module]) -> dict[str, Path]:
    """The file each part goes to: the first part at `target`, others suffixed."""
    names = list(parts)
    return {sub: target if i == 0 else target.with_name(f"{target.stem}_{sub}"
                                                        f"{target.suffix}")
            for i, sub in enumerate(names)}


def write_single_files(target: Path, parts: Mapping[str, nn.Module], dtype: torch.dtype,
                       metadata: Mapping[str, str]) -> list[Path]:
    from safetensors.torch import save_file

    written = []
    for sub, path in single_file_paths(target, parts).items():
        tensors = state_dict_as(parts[sub], dtype)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        atomic_write_with(path, lambda tmp, t=tensors: save_file(t, str(tmp),
                                                                 metadata=dict(metadata)),
                          expected_bytes=size)
        written.append(path)
    return written


def remove_model_output(path: Path) -> bool:
    """Delete a model output aitk wrote: a folder's listed files (then the folders
    left empty), or a single file; anything not provably ours stays. True if removed."""
    from aitk.run.ownership import lora_is_ours, model_folder_files

    if path.is_dir():
        files = model_folder_files(path)
        if files is None:
            return False
        for file in files:
            if file.is_file() and not file.is_symlink():
                file.unlink()
        for folder in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        if not any(path.iterdir()):
            path.rmdir()
        return True
    if lora_is_ours(path):
        path.unlink()
        return True
    return False


def metadata_strings(values: Mapping[str, Any]) -> dict[str, str]:
    """safetensors metadata holds strings: others as JSON."""
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
