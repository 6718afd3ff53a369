"""Weight memory and peak RSS of quantizing a ~200M-parameter Flux transformer.

    .venv/bin/python bench/quantize_memory.py [--mode blockwise|whole] [--variants ...]

Each variant runs in its own subprocess (a fresh heap, so one variant's freed memory
cannot hide another's peak). In the child:

1. a FluxTransformer2DModel (3 double + 6 single blocks, hidden 1024, T5/CLIP widths of
   FLUX.1; about 212M parameters) is built with random weights directly in bf16 (default
   dtype bf16: no float32 copy ever exists);
2. the kernel's peak-RSS counter is reset (`echo 5 > /proc/self/clear_refs`), then the
   model is quantized as the trainer does it (aitk.models.quantize.quantize_linear_layers with
   Flux's exclusions, one block at a time; `--mode whole` uses quanto's quantize+freeze
   over the whole model instead, for comparison);
3. it reports the weight bytes (aitk.models.quantize.weight_bytes: quantized data + scales) and
   VmHWM, the peak RSS since the reset.

Figures: weights / bf16 weights (target for qfloat8 <= 0.55), and the peak RSS during
quantization above the RSS before the model was built, over the bf16 model's bytes
(target <= 1.2), and the RSS left after quantizing, same scale. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("bf16", "qfloat8", "qint8", "qint4")
# ~212M parameters: FLUX.1's block structure and text widths, narrower and shallower.
CONFIG = dict(patch_size=1, in_channels=64, num_layers=3, num_single_layers=6,
              attention_head_dim=128, num_attention_heads=8, joint_attention_dim=4096,
              pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(variant: str, mode: str) -> dict:
    sys.path.insert(0, str(REPO))
    import torch
    from diffusers import FluxTransformer2DModel

    from aitk.models.flux.model import TRANSFORMER_QUANT_EXCLUDE
    from aitk.models.quantize import _qtype, quantize_linear_layers, weight_bytes

    gc.collect()
    base_kib = status_kib("VmRSS")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = FluxTransformer2DModel(**CONFIG).requires_grad_(False)
    torch.set_default_dtype(torch.float32)
    gc.collect()
    params = sum(p.numel() for p in model.parameters())
    bf16_bytes = weight_bytes(model)
    built_kib = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    if variant != "bf16":
        if mode == "whole":
            from optimum.quanto import freeze, quantize

            quantize(model, weights=_qtype(variant), exclude=list(TRANSFORMER_QUANT_EXCLUDE))
            freeze(model)
        else:
            quantize_linear_layers(model, variant, exclude=TRANSFORMER_QUANT_EXCLUDE)
    gc.collect()
    peak_kib = status_kib("VmHWM")
    return {"variant": variant, "mode": mode, "params": params, "bf16_bytes": bf16_bytes,
            "weight_bytes": weight_bytes(model), "base_kib": base_kib,
            "built_kib": built_kib, "peak_kib": peak_kib,
            "after_kib": status_kib("VmRSS")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("blockwise", "whole"), default="blockwise")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.mode)))
        return 0
    rows = []
    for variant in args.variants:
        out = subprocess.run([sys.executable, __file__, "--child", variant, "--mode",
                              args.mode], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{variant:8s} params {r['params'] / 1e6:.1f}M  weights "
              f"{r['weight_bytes'] / 2**20:7.1f} MiB = {r['weight_bytes'] / r['bf16_bytes']:.3f}"
              f" of bf16  peak RSS while quantizing (above the pre-build RSS) "
              f"{(r['peak_kib'] - r['base_kib']) * 1024 / r['bf16_bytes']:.3f} x bf16 model, "
              f"after {(r['after_kib'] - r['base_kib']) * 1024 / r['bf16_bytes']:.3f} x",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
