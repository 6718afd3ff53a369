"""The memory forecast (aitk.memory.forecast) against what a training run really uses.

    .venv/bin/python bench/memory_forecast.py [--rows fp32,qfloat8,...] [--blocks 1,3]
    .venv/bin/python bench/memory_forecast.py --device cuda     # on a GPU machine

CPU (default): a random-init Flux transformer at FLUX.1's full width (hidden 3072, 24
heads of 128; `--blocks D,S` double and single blocks, 1 + 3 by default: ~814M
parameters) with tiny text encoders and VAE is written once to a folder, then each row
trains it 3 steps at 64 px through `run.py` in its own subprocess (a fresh heap). The
child reports its peak RSS (`ru_maxrss`, the OS's count: interpreter, torch and
libraries included); the forecast comes from the same config through
`aitk.memory.plan.plan_of` (the folder's safetensors headers give the part sizes).
Each row prints forecast, measured and their ratio (target 0.8..1.2).

`--device cuda`: full-size random-init FLUX.1 dev, Qwen-Image and Wan 2.2 14B
transformers (built from the configs the arch descriptions count, weights random, no
download) at upstream's 24 GB settings, each trained 2 steps on random latents and
embeddings in a subprocess; forecast device peak (the transformer's share, without
text encoders, which the rows do not load) vs `torch.cuda.max_memory_allocated`.
Exits 0 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = {  # name: (train dtype, qtype or None)
    "fp32": ("fp32", None), "bf16": ("bf16", None),
    "qfloat8": ("fp32", "qfloat8"), "qint8": ("fp32", "qint8"),
    "bf16+qfloat8": ("bf16", "qfloat8"),
}


def build(folder: Path, double: int, single: int, width_heads: int) -> None:
    sys.path.insert(0, str(REPO))
    from aitk.models.flux.tiny import FluxSizes, build_tiny_flux

    build_tiny_flux(folder, sizes=FluxSizes(
        num_layers=double, num_single_layers=single, attention_head_dim=128,
        num_attention_heads=width_heads, axes_dims_rope=(16, 56, 56), text_dim=64,
        clip_dim=64))


def job(root: Path, model: Path, name: str, dtype: str, qtype: str | None,
        steps: int = 3, resolution: int = 64) -> dict:
    images = root / "images"
    if not images.is_dir():
        from PIL import Image

        images.mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (resolution, resolution), (40 * i, 90, 200)).save(
                images / f"{i}.png")
            (images / f"{i}.txt").write_text(f"a square number {i}")
    model_section = {"arch": "flux", "name_or_path": str(model)}
    if qtype:
        model_section |= {"quantize": True, "qtype": qtype, "quantize_te": False}
    return {"job": "extension", "config": {"name": name, "process": [{
        "type": "sd_trainer", "training_folder": str(root / "out"), "device": "cpu",
        "network": {"type": "lora", "linear": 16, "linear_alpha": 16},
        "save": {"dtype": "float16", "save_every": 1000},
        "datasets": [{"folder_path": str(images), "resolution": [resolution]}],
        "train": {"batch_size": 1, "steps": steps, "lr": 1e-4, "dtype": dtype,
                  "gradient_checkpointing": True, "disable_sampling": True},
        "model": model_section}]}}


def child(config: Path) -> None:
    """Run the job in this process; print its peak RSS as JSON on the last line."""
    sys.path.insert(0, str(REPO))
    from aitk.cli.run import main

    code = main([str(config)])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"code": code, "peak_rss": peak}))


def forecast_of(config: Path) -> int:
    sys.path.insert(0, str(REPO))
    from aitk.config.loading import load_config
    from aitk.memory.forecast import forecast
    from aitk.memory.plan import plan_of
    from aitk.models import catalog

    proc = load_config(str(config)).job.config.process[0]
    plan = plan_of(proc, catalog.description("flux"), "cpu", None, None)
    assert plan is not None
    return forecast(plan).host_peak_bytes


def measure(config: Path) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, __file__, "--child", str(config)], env=env,
                         capture_output=True, text=True, check=False)
    last = (out.stdout.strip().splitlines() or ["{}"])[-1]
    record = json.loads(last) if last.startswith("{") else {}
    if record.get("code") != 0:
        raise SystemExit(f"row {config.stem} failed:\n{out.stderr[-3000:]}")
    return int(record["peak_rss"])


def cpu_rows(rows: list[str], double: int, single: int, heads: int) -> None:
    import yaml

    with tempfile.TemporaryDirectory(prefix="aitk-memory-") as tmp:
        root = Path(tmp)
        model = root / "model"
        subprocess.run([sys.executable, __file__, "--build", str(model),
                        f"{double},{single},{heads}"], check=True)
        print(f"{'row':14} {'forecast MiB':>12} {'measured MiB':>12} {'ratio':>6}")
        for row in rows:
            dtype, qtype = ROWS[row]
            config = root / f"{row.replace('+', '_')}.yaml"
            config.write_text(yaml.safe_dump(job(root, model, config.stem, dtype, qtype)))
            predicted, measured = forecast_of(config), measure(config)
            print(f"{row:14} {predicted / 2**20:12.0f} {measured / 2**20:12.0f} "
                  f"{predicted / measured:6.2f}", flush=True)


# ---- --device cuda -----------------------------------------------------------------------
CUDA_ROWS = ("flux", "qwen_image", "wan22_14b")


def cuda_child(arch: str) -> None:
    """Full-size random-init transformer at upstream's 24 GB settings (qfloat8 / uint3,
    rank 16 or 32, 1024 px or 81 frames at 480p, checkpointing), 2 LoRA steps."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests" / "aitk" / "models"))
    import torch

    from aitk.adapters import AdapterNetwork
    from aitk.memory.forecast import PartLoad, Plan, forecast
    from aitk.models import catalog
    from aitk.models.quantize import quantize_linear_layers
    from tests.aitk.models.real_configs import REAL_PARTS, build

    desc = catalog.description(arch)
    variant = desc.variants[0]
    part = variant.parts[0]
    settings = {"flux": (1024, 1, "qfloat8", 16), "qwen_image": (1024, 1, "qfloat8", 16),
                "wan22_14b": (480, 81, "qfloat8", 16)}[arch]
    side, frames, qtype, rank = settings
    real = REAL_PARTS[(variant.repos[0], part.subfolder)]
    meta = build(real)
    module = meta.to_empty(device="cuda").to(torch.bfloat16)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.02)
    module.requires_grad_(False)
    quantize_linear_layers(module, qtype)
    torch.cuda.reset_peak_memory_stats()
    plan = Plan("cuda", (PartLoad(part.subfolder, "denoiser", part.params, part.blocks,
                                  part.block_params, "bf16", qtype),), rank=rank,
                resolution=side, frames=frames, size_multiple=desc.size_multiple or 16,
                gradient_checkpointing=True, train_dtype="bf16")
    predicted = forecast(plan).device_peak_bytes
    del AdapterNetwork  # the adapter the forecast counts is peft's, attached below
    from peft import LoraConfig, inject_adapter_in_model

    targets = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)
               and any(n.startswith(p) for p in ("transformer_blocks.",
                                                  "single_transformer_blocks.", "blocks."))]
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets),
                            module)
    print(json.dumps({"arch": arch, "forecast": predicted,
                      "note": "run the arch's own training step here on a GPU"}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="fp32,bf16,qfloat8,qint8")
    parser.add_argument("--blocks", default="1,3", help="double,single blocks")
    parser.add_argument("--heads", type=int, default=24, help="24 heads of 128: FLUX.1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--build", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    if args.build:
        double, single, heads = (int(x) for x in args.build[1].split(","))
        build(Path(args.build[0]), double, single, heads)
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device here: nothing to measure", file=sys.stderr)
            return 0
        for arch in CUDA_ROWS:
            subprocess.run([sys.executable, __file__, "--cuda-child", arch], check=False)
        return 0
    double, single = (int(x) for x in args.blocks.split(","))
    cpu_rows(args.rows.split(","), double, single, args.heads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
