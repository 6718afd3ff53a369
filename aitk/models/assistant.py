"""Upstream's `model.assistant_lora_path`: a training adapter merged into frozen weights.

A step-distilled model (FLUX.1 schnell, Z-Image Turbo, Krea 2 Turbo) drifts out of its
distillation when a LoRA is trained on it directly. Upstream trains it through a
"de-distillation" LoRA published for the purpose: the adapter is merged into the frozen
base weights (W += up @ down * alpha / rank) before quantization and before the trained
adapter attaches, so training runs on the de-distilled model and the saved LoRA holds
only what was trained.

For previews upstream takes the adapter out again (it samples with the adapter at -1 for
Z-Image Turbo and Krea 2 Turbo), so a preview shows the fast distilled model plus the
trained LoRA, sampled as that model is meant to be (few steps, no CFG). `removed()` does
the same with a forward hook on each merged Linear that subtracts the adapter's output:
exact on float weights, and it works on quantized ones, whose weights cannot be edited.

Where the file is: a local `.safetensors` path, a hub file `owner/repo/file.safetensors`
(Z-Image's and Krea 2's adapters, as upstream's web UI writes them), or a hub repo
`owner/repo` holding `pytorch_lora_weights.safetensors` (upstream's schnell adapter).

Use (an arch's `load_model`, before quantizing):

    deltas = merge_assistant(transformer, spec, "Z-Image")   # {module path: LoraDelta}
    ...
    with removed(transformer, deltas):                        # previews without it
        ...

`to_internal` maps a file's keys to the module paths of `transformer` when the file is
not in `diffusion_model.`/`transformer.` + diffusers names (Krea 2's adapter is in
Krea's own names). The lower-level pieces (`resolve_adapter_file`, `read_lora_file`,
`merge`, `hook_deltas`: a LoRA applied unmerged by forward hooks, as accuracy recovery
adapters are, aitk.models.recovery_adapter) are for other frozen uses of a LoRA file;
every failure is one ModelLoadError line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from aitk.adapters.keys import ALPHA_SUFFIX, from_public_keys
from aitk.errors import AdapterKeyError, ModelLoadError

__all__ = ["LoraDelta", "hook_deltas", "merge", "merge_assistant", "read_lora_file",
           "removed", "resolve_adapter_file"]

DOWN, UP = ".lora_A.weight", ".lora_B.weight"
HUB_REPO_FILE = "pytorch_lora_weights.safetensors"  # what an `owner/repo` adapter holds


@dataclass(frozen=True)
class LoraDelta:
    """One layer's adapter: its delta is `up @ down * scale`."""

    down: torch.Tensor  # (rank, in)
    up: torch.Tensor  # (out, rank)
    scale: float  # alpha / rank

    def delta(self) -> torch.Tensor:
        return (self.up.float() @ self.down.float()) * self.scale


def resolve_adapter_file(spec: str, arch: str, what: str = "assistant_lora_path") -> Path:
    """The adapter file `spec` names, downloaded from the hub when it is a hub file or
    repo (one ModelLoadError line when it cannot be had, e.g. offline)."""
    from aitk.models.loading import hub_file

    local = Path(spec).expanduser()
    if local.is_file():
        return local
    parts = spec.split("/")
    hub_shaped = (not spec.startswith((".", "/", "~")) and "\\" not in spec
                  and not local.exists() and all(parts))
    if hub_shaped and len(parts) == 3 and spec.endswith(".safetensors"):
        return hub_file("/".join(parts[:2]), parts[2], arch, what)
    if hub_shaped and len(parts) == 2:
        return hub_file(spec, HUB_REPO_FILE, arch, what)
    raise ModelLoadError(f"{what} {spec} does not exist (a .safetensors file, a hub file "
                         "owner/repo/file.safetensors, or a hub repo owner/repo holding "
                         f"{HUB_REPO_FILE})")


def read_lora_file(path: Path, to_internal: Callable[[Mapping[str, torch.Tensor]],
                                                     dict[str, torch.Tensor]] = from_public_keys,
                   what: str = "assistant LoRA") -> dict[str, LoraDelta]:
    """{module path: LoraDelta} of a LoRA file; `to_internal` maps the file's keys to the
    model's module paths (`.lora_A.weight` / `.lora_B.weight` / `.alpha`). A module
    without alpha gets alpha = rank."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = to_internal(load_file(str(path)))
    except (AdapterKeyError, SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{what} {path} cannot be read: {exc}") from None
    deltas: dict[str, LoraDelta] = {}
    for key, down in weights.items():
        if not key.endswith(DOWN):
            continue
        name = key[: -len(DOWN)]
        up = weights.get(name + UP)
        if up is None:
            raise ModelLoadError(f"{what} {path}: {name} has a down weight but no up weight")
        rank = down.shape[0]
        alpha = weights.get(name + ALPHA_SUFFIX)
        deltas[name] = LoraDelta(down, up, (float(alpha) if alpha is not None else rank) / rank)
    if not deltas:
        raise ModelLoadError(f"{what} {path} holds no LoRA weights")
    return deltas


def _linear(module: nn.Module, name: str, path: Path, arch: str, what: str) -> nn.Linear:
    layer = dict(module.named_modules()).get(name)
    if not isinstance(layer, nn.Linear):
        raise ModelLoadError(f"{what} {path}: {name} is not a Linear layer of this {arch} "
                             f"transformer (is it a {arch} LoRA?)")
    return layer


def merge(module: nn.Module, deltas: Mapping[str, LoraDelta], path: Path, arch: str,
          what: str = "assistant LoRA") -> int:
    """Add each delta to its Linear's float weight; returns the number of layers changed.
    Every name is checked before any weight changes, so a mismatched file leaves the
    model as it was."""
    layers = {name: _linear(module, name, path, arch, what) for name in deltas}
    for name, layer in layers.items():
        d = deltas[name]
        shape = (d.up.shape[0], d.down.shape[1])
        if shape != tuple(layer.weight.shape):
            raise ModelLoadError(f"{what} {path}: {name} changes a {shape[0]}x{shape[1]} "
                                 f"weight; the layer's is {tuple(layer.weight.shape)}")
    with torch.no_grad():
        for name, layer in layers.items():
            layer.weight.add_(deltas[name].delta().to(layer.weight.device, layer.weight.dtype))
    return len(layers)


def merge_assistant(module: nn.Module, spec: str, arch: str,
                    to_internal: Callable[[Mapping[str, torch.Tensor]],
                                          dict[str, torch.Tensor]] = from_public_keys
                    ) -> dict[str, LoraDelta]:
    """`model.assistant_lora_path` = `spec`: find the file (local or hub), read it and
    merge it into `module`'s float weights. Returns the deltas, which `removed()` takes
    to take them out again for previews."""
    path = resolve_adapter_file(spec, arch)
    deltas = read_lora_file(path, to_internal)
    merge(module, deltas, path, arch)
    return deltas


def hook_deltas(module: nn.Module, deltas: Mapping[str, LoraDelta],
                sign: float = 1.0) -> list[torch.utils.hooks.RemovableHandle]:
    """A forward hook on each Linear of `deltas` that adds `sign` times its adapter's
    output (y + sign * scale * (x @ down.T) @ up.T), leaving the weights as they are
    (quantized ones cannot be edited). Returns the handles."""
    modules = dict(module.named_modules())

    def hook_for(delta: LoraDelta):
        cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

        def add(_layer: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            x = args[0]
            key = (x.device, x.dtype)
            if key not in cache:
                cache[key] = (delta.down.to(x.device, x.dtype),
                              (delta.up.float() * (delta.scale * sign)).to(x.device, x.dtype))
            down, up = cache[key]
            return output + (x @ down.T) @ up.T

        return add

    return [modules[name].register_forward_hook(hook_for(delta))
            for name, delta in deltas.items()]


@contextlib.contextmanager
def removed(module: nn.Module, deltas: Mapping[str, LoraDelta]) -> Iterator[None]:
    """Inside the block each merged Linear's output has its adapter's part subtracted
    (y - scale * (x @ down.T) @ up.T): the model as it was before the merge. The hooks go
    when the block ends, even on error."""
    handles = []
    try:
        handles = hook_deltas(module, deltas, sign=-1.0)
        yield
    finally:
        for handle in handles:
            handle.remove()
