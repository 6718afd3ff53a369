"""Full-size Flux LoRA training step on a GPU: s/step and peak memory at 1024 px.

    .venv/bin/python bench/flux_gpu.py [--variants bf16 qfloat8] [--steps 5] [--warmup 2]

Builds a FLUX.1-dev-sized FluxTransformer2DModel (19 double + 38 single blocks, hidden
3072, guidance embedding; about 11.9B parameters) with random weights, no download,
directly on the GPU in bf16, and for each of bf16 / qfloat8 (aitk.models.quantize, Flux's
exclusions, one layer at a time) x gradient checkpointing off / on, attaches a rank-16
LoRA to the blocks (aitk.adapters) and times forward + backward + AdamW on a 1024x1024
batch of one (4096 image tokens of 2x2 packed latents, 512 T5 tokens). Reports the
median seconds per step after warm-up and torch.cuda.max_memory_allocated per case; a
case that runs out of memory is reported as such. Each case runs in its own subprocess
so one case's allocations cannot leak into the next one's peak.

Without CUDA it says so and exits 0; `--smoke` runs the same code on the CPU with a
tiny config (a check that the script works, not a measurement). Needs about 24 GB
for the bf16 weights alone; bf16 without checkpointing needs far more for activations
(an 80 GB+ GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FULL = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
            pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
PIXELS, T5_TOKENS = 1024, 512


# `--smoke`: the same code path on the CPU with a tiny config (checks the script runs).
TINY = dict(FULL, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
            axes_dims_rope=(4, 6, 6))


def case(variant: str, checkpointing: bool, steps: int, warmup: int,
         smoke: bool = False) -> dict:
    sys.path.insert(0, str(REPO))
    from types import SimpleNamespace

    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from aitk.adapters import AdapterNetwork
    from aitk.models.flux.model import TRANSFORMER_QUANT_EXCLUDE, FluxModel
    from aitk.models.quantize import quantize_linear_layers, weight_bytes

    device = torch.device("cpu" if smoke else "cuda")
    config, pixels, t5_tokens = (TINY, 64, 8) if smoke else (FULL, PIXELS, T5_TOKENS)
    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)
        transformer = FluxTransformer2DModel(**config).requires_grad_(False)
        torch.set_default_dtype(torch.float32)
    if variant != "bf16":
        quantize_linear_layers(transformer, variant, exclude=TRANSFORMER_QUANT_EXCLUDE)
    if checkpointing:
        transformer.enable_gradient_checkpointing()
    weights = weight_bytes(transformer)

    holder = SimpleNamespace(arch="flux", use_old_lokr_format=False,
                             lora_block_prefixes=FluxModel.lora_block_prefixes,
                             get_model_to_train=lambda: transformer)
    net = AdapterNetwork.attach(holder, SimpleNamespace(type="lora", linear=16,
                                                        linear_alpha=16))
    params = net.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=1e-4)
    transformer.train()

    side = pixels // 16  # latent side / 2: packed tokens per side
    b, c = 1, config["in_channels"] // 4
    latents = torch.randn(b, c, 2 * side, 2 * side, device=device, dtype=torch.bfloat16)
    packed = FluxPipeline._pack_latents(latents, b, c, 2 * side, 2 * side)
    img_ids = FluxPipeline._prepare_latent_image_ids(b, side, side, device, torch.bfloat16)
    text = torch.randn(b, t5_tokens, config["joint_attention_dim"], device=device,
                       dtype=torch.bfloat16)
    txt_ids = torch.zeros(t5_tokens, 3, device=device, dtype=torch.bfloat16)
    pooled = torch.randn(b, config["pooled_projection_dim"], device=device,
                         dtype=torch.bfloat16)
    t = torch.full((b,), 0.5, device=device, dtype=torch.bfloat16)
    guidance = torch.ones(b, device=device)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = transformer(hidden_states=packed, timestep=t, guidance=guidance,
                          pooled_projections=pooled, encoder_hidden_states=text,
                          txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(out.float(), packed.float())
        loss.backward()
        opt.step()

    try:
        for _ in range(warmup):
            step()
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - start)
    except torch.cuda.OutOfMemoryError:
        return {"variant": variant, "checkpointing": checkpointing, "oom": True,
                "weight_gib": weights / 2**30}
    cuda = device.type == "cuda"
    return {"variant": variant, "checkpointing": checkpointing, "oom": False,
            "s_per_step": statistics.median(times),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
            "weight_gib": weights / 2**30,
            "params_b": sum(p.numel() for p in transformer.parameters()) / 1e9,
            "gpu": torch.cuda.get_device_name() if cuda else "cpu smoke run"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["bf16", "qfloat8"],
                        choices=["bf16", "qfloat8", "qint8", "qint4"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true",
                        help="run a tiny config on the CPU (checks the script, no figures)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("flux_gpu: no CUDA device here; this benchmark needs an NVIDIA GPU "
              "(about 24 GB for the bf16 weights). Nothing run.")
        return 0
    if args.child:
        variant, ckpt = args.child
        print(json.dumps(case(variant, ckpt == "1", args.steps, args.warmup, args.smoke)))
        return 0
    for variant in args.variants:
        for ckpt in ("0", "1"):
            argv = [sys.executable, __file__, "--child", variant, ckpt, "--steps",
                    str(args.steps), "--warmup", str(args.warmup)]
            out = subprocess.run(argv + (["--smoke"] if args.smoke else []),
                                 capture_output=True, text=True)
            lines = out.stdout.strip().splitlines()
            if out.returncode != 0 or not lines:
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"{variant:8s} checkpointing {ckpt == '1'!s:5s}: failed: {tail}")
                continue
            r = json.loads(lines[-1])
            label = f"{variant:8s} checkpointing {r['checkpointing']!s:5s}"
            if r["oom"]:
                print(f"{label}: out of memory (weights {r['weight_gib']:.1f} GiB)")
            else:
                print(f"{label}: {r['s_per_step']:.3f} s/step, peak {r['peak_gib']:.1f} GiB "
                      f"(weights {r['weight_gib']:.1f} GiB, {r['params_b']:.1f}B params, "
                      f"{r['gpu']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
