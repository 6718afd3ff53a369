"""LoRA files applied to a loaded model without training anything: as forward hooks
(generation: weights changeable per image, the model's own weights untouched, quantized
layers included) or merged into the weights (a merged model to save).

A file is read in any layout the arch reads (its `convert_lora_weights_before_load`;
an arch that splits its LoRA into per-part files, Wan 2.2's experts, is read from its
parts), so a LoRA applies here exactly as training saved it: each layer gets
weight * (alpha / rank) * up @ down (aitk.adapters.lora_files.LoraModule).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aitk.adapters.keys import ALPHA_SUFFIX
from aitk.adapters.lora_files import LoraFile, LoraFileError, LoraModule


def _load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises several types for a torn file
        raise LoraFileError(f"{path} is not a readable safetensors file ({exc})") from None


def read_for_model(model: Any, path: Path) -> dict[str, LoraModule]:
    """A LoRA file (or the arch's per-part files named after it) -> its modules by layer
    path inside `model.get_model_to_train()`."""
    from aitk.adapters.network import part_path

    path = Path(path).expanduser()
    if path.is_file():
        public = _load(path)
    else:
        parts = {s: part_path(path, s) for s in model.lora_file_suffixes()}
        found = {s: _load(p) for s, p in parts.items() if p.is_file()}
        if not found:
            raise LoraFileError(f"LoRA file {path} does not exist")
        public = model.join_lora_files(found)
    try:
        internal = model.convert_lora_weights_before_load(public)
    except ValueError as exc:  # AdapterKeyError and the archs' own key errors
        raise LoraFileError(f"{path} is not a {model.arch} LoRA: {exc}") from None
    # Internal names carry peft's suffixes and `<layer>.alpha` (aitk.adapters.keys).
    weights = {k: v for k, v in internal.items() if not k.endswith(ALPHA_SUFFIX)}
    alphas = {k: v for k, v in internal.items() if k.endswith(ALPHA_SUFFIX)}
    lora = LoraFile.from_tensors({**weights, **alphas})
    if lora.lokr:
        raise LoraFileError(f"{path} is a LoKr file; generation and merging apply LoRA "
                            "files")
    return lora.modules


def _layers(model: Any, modules: dict[str, LoraModule], path: Path) -> dict[str, nn.Module]:
    found = dict(model.get_model_to_train().named_modules())
    out = {}
    for name in modules:
        layer = found.get(name)
        if not isinstance(layer, nn.Linear | nn.Conv2d):
            raise LoraFileError(f"{path}: {name} is not a Linear or Conv layer of this "
                                f"{model.arch} model (is the LoRA for another model?)")
        out[name] = layer
    return out


class LoraHooks:
    """`loras` [(path, weight)] on `model`'s layers, as forward hooks adding
    multiplier * weight * scale * up(down(x)) to each layer's output."""

    def __init__(self, model: Any, loras: Sequence[tuple[Path, float]]) -> None:
        self.multiplier = 1.0
        self._handles: list[Any] = []
        per_layer: dict[str, list[tuple[LoraModule, float]]] = {}
        layers: dict[str, nn.Module] = {}
        for path, weight in loras:
            modules = read_for_model(model, Path(path))
            layers.update(_layers(model, modules, Path(path)))
            for name, module in modules.items():
                per_layer.setdefault(name, []).append((module, float(weight)))
        for name, entries in per_layer.items():
            self._handles.append(layers[name].register_forward_hook(self._hook(entries)))

    def _hook(self, entries: list[tuple[LoraModule, float]]) -> Any:
        def add(layer: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            if self.multiplier == 0:
                return output
            x = args[0]
            for module, weight in entries:
                down = module.down.to(x.device, x.dtype)
                up = module.up.to(x.device, x.dtype)
                if isinstance(layer, nn.Conv2d):
                    h = F.conv2d(x, down, stride=layer.stride, padding=layer.padding,
                                 dilation=layer.dilation)
                    h = F.conv2d(h, up)
                else:
                    h = F.linear(F.linear(x, down), up)
                output = output + h * (self.multiplier * weight * module.scale)
            return output

        return add

    def set_multiplier(self, value: float) -> None:
        self.multiplier = float(value)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> LoraHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def merge_into_weights(model: Any, loras: Sequence[tuple[Path, float]]) -> int:
    """Add each LoRA's weighted delta to the layers' own weights (float32 math); returns
    the number of layers changed. Quantized layers cannot take it."""
    changed: set[str] = set()
    for path, weight in loras:
        modules = read_for_model(model, Path(path))
        for name, layer in _layers(model, modules, Path(path)).items():
            if type(layer) not in (nn.Linear, nn.Conv2d):
                raise LoraFileError(f"{name} is a quantized layer; merge into an "
                                    "unquantized model (model.quantize: false)")
            delta = modules[name].delta() * float(weight)
            if delta.shape != layer.weight.shape:
                raise LoraFileError(f"{path}: {name} has shape {tuple(delta.shape)}, the "
                                    f"layer {tuple(layer.weight.shape)}")
            with torch.no_grad():
                merged = layer.weight.float() + delta.to(layer.weight.device)
                layer.weight.copy_(merged.to(layer.weight.dtype))
            changed.add(name)
    return len(changed)
