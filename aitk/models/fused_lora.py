"""Upstream's `model.lora_path` in a training job: a LoRA fused into the frozen denoiser
before the trained adapter attaches, so training (and the previews) run on the base
model plus that LoRA at weight 1, and the saved LoRA holds only what was trained (a full
fine-tune saves the weights with it fused, as upstream's does).

Float weights get the LoRA merged into them (W += up @ down * alpha / rank, as upstream's
`fuse_lora`); quantized ones cannot be edited, so there each covered Linear gets a
forward hook that adds the LoRA's output (aitk.models.assistant.hook_deltas), the same
function without the rounding. The file's keys go through the arch's own
`convert_lora_weights_before_load`, so any LoRA file aitk reads for the arch fits;
LoRA (not LoKr) layers of the denoiser only. Every failure is one ModelLoadError line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from aitk.errors import ModelLoadError
from aitk.models.assistant import hook_deltas, merge, read_lora_file, resolve_adapter_file
from aitk.models.recovery_adapter import mismatch

WHAT = "model.lora_path"


def fuse_lora(module: nn.Module, spec: str, arch: str,
              to_internal: Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]],
              quantized: bool) -> int:
    """Fuse the LoRA `spec` names (a file, or a hub file as assistant_lora_path takes)
    into `module`; every key is checked before anything changes. Returns the number of
    layers it changes."""
    path = resolve_adapter_file(spec, arch, what=WHAT)
    deltas = read_lora_file(path, to_internal, what=WHAT)
    modules = dict(module.named_modules())
    for name, delta in deltas.items():
        problem = mismatch(delta, modules.get(name))
        if problem:
            raise ModelLoadError(f"{WHAT} {path} does not fit this {arch} denoiser: first "
                                 f"mismatched key {name}.lora_A.weight ({problem}); is it "
                                 f"a LoRA of this arch's denoiser?")
    if quantized:
        hook_deltas(module, deltas)
    else:
        merge(module, deltas, path, arch, what=WHAT)
    return len(deltas)
