"""Accuracy recovery adapters: a LoRA fitted to undo the error of quantizing a model
to few bits (upstream's "3 bit with ARA" / "4 bit with ARA"), applied frozen on the
quantized base in training and previews.

`model.qtype: "uint3|owner/repo/file.safetensors"` (or a local file), or
`model.accuracy_recovery_adapter`, names it. As upstream does (toolkit/util/quantize.py):

- the file is a LoRA in the public layout (`diffusion_model.` + the transformer's module
  names, `lora_A`/`lora_B`, alpha = rank unless given), found locally or on the hub and
  read by aitk.models.assistant (the same pieces as the assistant LoRA of a
  step-distilled model);
- the layers it covers are quantized to the qtype, every other Linear to uint8;
- it is not merged (that would bring the rounding error back): a forward hook on each
  covered layer adds `x A^T B^T * scale` to its output (assistant.hook_deltas). The
  trained LoRA wraps the same layer and calls it, so it trains on the recovered model,
  and it is the only thing saved (the factors are in no state dict and no optimizer).

A hub file is fetched by huggingface_hub (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply);
offline without it, a missing local file or a file that does not fit the model is one
ModelLoadError line (exit 2) naming the file or the first mismatched key.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from aitk.errors import ModelLoadError
from aitk.models.assistant import LoraDelta, hook_deltas, read_lora_file, resolve_adapter_file

WHAT = "accuracy recovery adapter"
# Upstream quantizes the layers an adapter does not cover to uint8.
UNCOVERED_QTYPE = "uint8"


def read_adapter(spec: str, arch: str, prefix: str = ""
                 ) -> tuple[Path, dict[str, LoraDelta]]:
    """The adapter's file and its deltas for one transformer: those under `prefix`
    (Wan 2.2's `transformer_1.`), named relative to it."""
    path = resolve_adapter_file(spec, arch, what=WHAT)
    deltas = read_lora_file(path, what=WHAT)
    if prefix:
        deltas = {name[len(prefix):]: d for name, d in deltas.items()
                  if name.startswith(prefix)}
        if not deltas:
            raise ModelLoadError(f"{WHAT} {path} has no layers under {prefix}")
    return path, deltas


def mismatch(delta: LoraDelta, layer: nn.Module | None) -> str | None:
    """Why `delta` does not fit `layer` (None: it fits)."""
    if not isinstance(layer, nn.Linear):
        return "not a Linear layer of this model"
    want = (layer.out_features, layer.in_features)
    got = (delta.up.shape[0], delta.down.shape[1])
    if got != want or delta.up.shape[1] != delta.down.shape[0]:
        return f"shape {got[0]}x{got[1]}, the layer is {want[0]}x{want[1]}"
    return None


def apply_adapter(model: nn.Module, deltas: dict[str, LoraDelta], path: Path) -> int:
    """Hook each delta onto its (quantized) Linear in `model`, every key checked first;
    returns the layer count."""
    modules = dict(model.named_modules())
    for name, delta in deltas.items():
        problem = mismatch(delta, modules.get(name))
        if problem:
            raise ModelLoadError(f"{WHAT} {path} does not match this model: first "
                                 f"mismatched key {name}.lora_A.weight ({problem}); is it "
                                 "the adapter for this model?")
    hook_deltas(model, deltas)
    return len(deltas)
