"""Weight memory and peak RSS of each qtype on a ~212M-parameter Flux transformer.

    .venv/bin/python bench/quantize_memory.py [--mode load|blockwise|whole] [--variants ...]

Each variant runs in its own subprocess, started through a shell that forks (Linux
carries the high-water RSS of the process that calls exec into the child's ru_maxrss),
so one variant's heap cannot hide or inflate another's peak.

The model: a FluxTransformer2DModel (3 double + 6 single blocks, hidden 1024, T5/CLIP
widths of FLUX.1; about 212M parameters) with random weights in bf16.

- `--mode load` (default, what the trainer does): the model is saved once as a bf16
  diffusers folder; each child loads it as the trainer would (`load_part` for bf16,
  aitk.models.quantized_loading for a qtype: each block quantized as it is read), runs
  one forward (which touches every weight), and reports ru_maxrss, the peak RSS of the
  whole process, imports included.
- `--mode blockwise` / `whole`: the model is built in memory in bf16 and quantized
  afterwards (aitk.models.quantize.quantize_linear_layers, or for quanto's types
  quanto's quantize+freeze over the whole model), peak RSS during quantization above the
  RSS before the build (VmHWM after `echo 5 > /proc/self/clear_refs`).

Figures, as ratios to bf16: weight bytes (aitk.models.quantize.weight_bytes: data +
scales) and peak RSS (`load`: the process's peak over the bf16 run's; the other modes:
peak above the pre-build RSS over the bf16 model's bytes). Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from aitk.models.qtypes import QTYPE_NAMES  # noqa: E402  (torch-free)

VARIANTS = ("bf16", *QTYPE_NAMES)
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
    from aitk.models.quantize import quantize_linear_layers, weight_bytes

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
            import optimum.quanto as quanto
            from optimum.quanto import freeze, quantize

            quantize(model, weights=getattr(quanto, variant),
                     exclude=list(TRANSFORMER_QUANT_EXCLUDE))
            freeze(model)
        else:
            quantize_linear_layers(model, variant, exclude=TRANSFORMER_QUANT_EXCLUDE)
    gc.collect()
    peak_kib = status_kib("VmHWM")
    return {"variant": variant, "mode": mode, "params": params, "bf16_bytes": bf16_bytes,
            "weight_bytes": weight_bytes(model), "base_kib": base_kib,
            "built_kib": built_kib, "peak_kib": peak_kib,
            "after_kib": status_kib("VmRSS")}


def build_folder(folder: Path) -> None:
    """The bf16 model saved as a diffusers transformer folder (`--mode load`)."""
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    FluxTransformer2DModel(**CONFIG).save_pretrained(folder / "transformer")


def load_child(variant: str, folder: Path) -> dict:
    import resource

    import torch
    from diffusers import FluxTransformer2DModel

    from aitk.models.flux.model import TRANSFORMER_QUANT_EXCLUDE
    from aitk.models.loading import load_part
    from aitk.models.quantize import weight_bytes
    from aitk.models.quantized_loading import load_part_quantized

    kw = {"torch_dtype": torch.bfloat16}
    if variant == "bf16":
        model = load_part(FluxTransformer2DModel, str(folder), "transformer", "flux", **kw)
    else:
        model = load_part_quantized(FluxTransformer2DModel, str(folder), "transformer",
                                    "flux", variant, exclude=TRANSFORMER_QUANT_EXCLUDE, **kw)
    c = model.config
    with torch.no_grad():  # touches every weight, as the first training step does
        model(hidden_states=torch.randn(1, 16, c.in_channels, dtype=torch.bfloat16),
              encoder_hidden_states=torch.randn(1, 8, c.joint_attention_dim,
                                                dtype=torch.bfloat16),
              pooled_projections=torch.randn(1, c.pooled_projection_dim,
                                             dtype=torch.bfloat16),
              timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3),
              txt_ids=torch.zeros(8, 3), guidance=torch.tensor([1.0]))
    return {"variant": variant, "mode": "load",
            "params": sum(p.numel() for p in model.parameters()),
            "weight_bytes": weight_bytes(model),
            "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def spawn(*args: str) -> dict:
    out = subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', sys.executable, __file__,
                          *args], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{' '.join(args)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("load", "blockwise", "whole"), default="load")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "build":
        build_folder(Path(args.folder))
        print("{}")
        return 0
    if args.child:
        result = load_child(args.child, Path(args.folder)) if args.mode == "load" \
            else child(args.child, args.mode)
        print(json.dumps(result))
        return 0
    variants = ["bf16", *(v for v in args.variants if v != "bf16")]
    if args.mode == "whole":
        from aitk.models.qtypes import QTYPES

        variants = [v for v in variants if v == "bf16" or QTYPES[v].backend == "quanto"]
    with tempfile.TemporaryDirectory(prefix="aitk quantize bench ") as tmp:
        if args.mode == "load":
            spawn("--child", "build", "--folder", tmp)
        rows: dict[str, dict] = {}
        for variant in variants:
            r = rows[variant] = spawn("--child", variant, "--mode", args.mode,
                                      "--folder", tmp)
            bf16 = rows["bf16"]
            weights = r["weight_bytes"] / bf16["weight_bytes"]
            if args.mode == "load":
                print(f"{variant:16s} weights {r['weight_bytes'] / 2**20:7.1f} MiB = "
                      f"{weights:.3f} of bf16   peak RSS {r['peak_kib'] / 1024:7.1f} MiB = "
                      f"{r['peak_kib'] / bf16['peak_kib']:.3f} of bf16", flush=True)
            else:
                print(f"{variant:16s} weights {weights:.3f} of bf16   peak RSS while "
                      f"quantizing (above the pre-build RSS) "
                      f"{(r['peak_kib'] - r['base_kib']) * 1024 / r['bf16_bytes']:.3f} x "
                      f"bf16 model, after "
                      f"{(r['after_kib'] - r['base_kib']) * 1024 / r['bf16_bytes']:.3f} x",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
