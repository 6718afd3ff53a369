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
denoisers (built from the real configs the arch descriptions are counted from,
tests/aitk/models/real_configs.py; weights random, no download) inside the arch's own
model class, at upstream's 24 GB settings (qfloat8, rank 16, checkpointing, 1024 px;
Wan 81 frames at 512 px), each trained 2 steps on random latents and embeddings in a
subprocess: the forecast's training term (weights, adapter, activations; the text
encoders are not loaded full-size) vs `torch.cuda.max_memory_allocated`. Exits 0
without CUDA. `--smoke` (any device, e.g. `--device cpu --smoke`) runs the same code
with one block a list at 64 px.
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
# arch: (hub repo of the configs, denoiser subfolders, text width key, pooled width key,
# side, frames) at upstream's 24 GB example settings (qfloat8, rank 16, checkpointing).
DEVICE_ROWS = {
    "flux": ("black-forest-labs/FLUX.1-dev", ("transformer",), "joint_attention_dim",
             "pooled_projection_dim", 1024, 1),
    "qwen_image": ("Qwen/Qwen-Image", ("transformer",), "joint_attention_dim", None, 1024, 1),
    "wan22_14b": ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", ("transformer", "transformer_2"),
                  "text_dim", None, 512, 81),
}


def device_row(arch: str, device: str, smoke: bool) -> dict:
    """The arch's own model class (its tiny text encoders and VAE) with its denoiser
    replaced by the full-size one built from the real config, random bf16 weights,
    quantized to qfloat8, rank-16 LoRA, checkpointing, 2 steps on random latents and
    embeddings. `smoke`: one block per list on the CPU at 64 px (checks the code path)."""
    sys.path.insert(0, str(REPO))
    from types import SimpleNamespace

    import torch

    from aitk.adapters import AdapterNetwork
    from aitk.memory.forecast import PartLoad, Plan, forecast
    from aitk.models import catalog, registry
    from aitk.models.prompt_embeds import AdvancedPromptEmbeds
    from aitk.models.quantize import quantize_linear_layers
    from tests.aitk.models.real_configs import REAL_PARTS

    repo, subfolders, text_key, pooled_key, side, frames = DEVICE_ROWS[arch]
    if smoke:
        side, frames = 64, min(frames, 5)
    cls = registry.get_model_class(arch)
    with tempfile.TemporaryDirectory(prefix="aitk-device-") as tmp:
        cls.build_tiny(Path(tmp) / "model")
        cfg = SimpleNamespace(name_or_path=str(Path(tmp) / "model"), arch=arch,
                              quantize=False, quantize_te=False, qtype="qfloat8",
                              qtype_te="qfloat8", low_vram=False, model_kwargs={},
                              assistant_lora_path=None, is_v_pred=None)
        model = cls(cfg, device=device, dtype=torch.bfloat16)
        model.load_model()
    denoisers, real_cfg = [], {}
    for sub in subfolders:
        real = REAL_PARTS[(repo, sub)]
        real_cfg = dict(real.config)
        if smoke:
            real_cfg |= {k: 1 for k in ("num_layers", "num_single_layers") if k in real_cfg}
        # Built on the device in bf16 (its own random init): computed buffers (RoPE
        # tables) are real, and no float32 copy of 20B parameters ever exists.
        import diffusers

        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                module = getattr(diffusers, real.cls).from_config(real_cfg)
        finally:
            torch.set_default_dtype(torch.float32)
        module.requires_grad_(False)
        quantize_linear_layers(module, "qfloat8")
        denoisers.append(module)
    if len(denoisers) == 2:
        from aitk.models.wan22.model import WanExperts

        model.model = WanExperts(*denoisers)
    else:
        model.model = denoisers[0]
    model.configure_training(SimpleNamespace(
        timestep_type="sigmoid", noise_offset=0.0, min_snr_gamma=None, cfg_scale=1.0,
        bypass_guidance_embedding=False, switch_boundary_every=1))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    net = AdapterNetwork.attach(model, SimpleNamespace(type="lora", linear=16,
                                                       linear_alpha=16, dropout=0.0,
                                                       network_kwargs={}))
    for module in denoisers:
        module.enable_gradient_checkpointing()
        module.train()
    params = list(net.trainable_parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    embeds = {"text_embeds": [torch.randn(512, real_cfg[text_key])]}
    if pooled_key:
        embeds["pooled_embeds"] = [torch.randn(1, real_cfg[pooled_key])]
    prompt = AdvancedPromptEmbeds(**embeds)
    shape = (1, 16, side // 8, side // 8) if frames == 1 else \
        (1, 16, (frames - 1) // 4 + 1, side // 8, side // 8)
    for step in range(2):
        model.begin_micro_step(step)
        pred = model.get_noise_prediction(torch.randn(shape), torch.tensor([500.0]), prompt)
        pred.float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    measured = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    desc = catalog.description(arch)
    counts = [(sum(t.numel() for t in m.parameters() if not t.requires_grad),
               [b for lst in m.children() if isinstance(lst, torch.nn.ModuleList)
                for b in lst]) for m in denoisers]
    parts = tuple(PartLoad(sub, "denoiser", n, len(blocks),
                           sum(t.numel() for b in blocks for t in b.parameters()
                               if not t.requires_grad), "bf16", "qfloat8")
                  for sub, (n, blocks) in zip(subfolders, counts, strict=True))
    plan = Plan(device.split(":")[0], parts, rank=16, resolution=side, frames=frames,
                size_multiple=desc.size_multiple or 16, gradient_checkpointing=True,
                train_dtype="bf16")
    predicted = forecast(plan).parts["train"]  # weights + adapter + activations
    return {"arch": arch, "forecast": int(predicted), "measured": measured}


def device_rows(device: str, smoke: bool) -> None:
    print(f"{'arch':12} {'forecast MiB':>12} {'max_allocated MiB':>17} {'ratio':>6}")
    for arch in DEVICE_ROWS:
        out = subprocess.run([sys.executable, __file__, "--device-child", arch, device]
                             + (["--smoke"] if smoke else []), capture_output=True,
                             text=True, check=False)
        last = (out.stdout.strip().splitlines() or ["{}"])[-1]
        if out.returncode != 0 or not last.startswith("{"):
            print(f"{arch:12} failed: {out.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        row = json.loads(last)
        got = row["measured"]
        ratio = f"{row['forecast'] / got:6.2f}" if got else "     -"
        print(f"{arch:12} {row['forecast'] / 2**20:12.0f} "
              f"{(got or 0) / 2**20:17.0f} {ratio}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="fp32,bf16,qfloat8,qint8")
    parser.add_argument("--blocks", default="1,3", help="double,single blocks")
    parser.add_argument("--heads", type=int, default=24, help="24 heads of 128: FLUX.1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--build", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--device-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="with --device: one block a list at 64 px (a code-path check, "
                        "on any device)")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    if args.build:
        double, single, heads = (int(x) for x in args.build[1].split(","))
        build(Path(args.build[0]), double, single, heads)
        return 0
    if args.device_child:
        print(json.dumps(device_row(*args.device_child, smoke=args.smoke)))
        return 0
    if args.device != "cpu" or args.smoke:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            print("no CUDA device here: nothing to measure", file=sys.stderr)
            return 0
        device_rows(args.device, args.smoke)
        return 0
    double, single = (int(x) for x in args.blocks.split(","))
    cpu_rows(args.rows.split(","), double, single, args.heads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
