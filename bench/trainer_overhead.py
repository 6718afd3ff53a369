"""Trainer overhead: steps/s of the example job against a bare PyTorch loop.

    .venv/bin/python bench/trainer_overhead.py [--steps 120] [--rounds 3] [--arch flux]

Both sides train the same model with the same LoRA on same-shaped batches (8 square
images, batch 2, cached latents and text embeddings): `--arch example` (default) the
tiny `example` model at 64 px; `--arch flux` a small random Flux transformer (diffusers'
FluxTransformer2DModel, hidden 512, 2 double + 4 single blocks, 32 T5 tokens) at 192 px,
whose step takes well over 0.2 s on a CPU, so it shows the overhead on a real arch.
`--clock cpu` times steps in the process's CPU time instead of wall time (for a machine
shared with other loads):

- job:  the real `run_job` (data order, caption handling, flow-matching loss, LR
        schedule, clipping, loss log, progress lines); step times from the loss log's
        per-step timestamps;
- bare: a loop over one pre-built batch doing the same forward, backward, clip and
        AdamW step, nothing else.

Each side's speed is 1 / (10th-percentile step time): on a shared machine other
processes slow some steps down, and the fast steps show what each side costs when it
gets the CPU (the median is printed too). Rounds alternate job/bare so background load
hits both alike. The figure is the median of the per-round ratios job/bare (target
>= 0.95; flux: >= 0.98).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aitk.config.loading import parse_job  # noqa: E402
from aitk.run.assembly import create_network, load_model  # noqa: E402
from aitk.run.job import run_job  # noqa: E402

SIDES = {"example": 64, "flux": 192}


def make_dataset(folder: Path, side: int) -> None:
    folder.mkdir(parents=True)
    for i in range(8):
        Image.new("RGB", (side, side), (30 * i, 255 - 30 * i, 90)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"image {i}")  # same token count for all


def build_model(arch: str, target: Path) -> Path:
    if arch == "flux":
        from aitk.models.flux.tiny import FluxSizes, build_tiny_flux

        return build_tiny_flux(target, sizes=FluxSizes(
            num_layers=2, num_single_layers=4, attention_head_dim=64, num_attention_heads=8,
            axes_dims_rope=(8, 28, 28), text_dim=64, clip_dim=64))
    from aitk.models.example.build import build_example_model

    return build_example_model(target)


def job_dict(root: Path, model_dir: Path, steps: int, name: str,
             arch: str = "example") -> dict:
    return {"job": "extension", "config": {"name": name, "process": [{
        "type": "sd_trainer", "training_folder": str(root / "out"), "device": "cpu",
        "network": {"type": "lora", "linear": 8, "linear_alpha": 8},
        "save": {"save_every": steps + 1, "dtype": "float32"},
        "datasets": [{"folder_path": str(root / "data"), "resolution": SIDES[arch],
                      "cache_latents_to_disk": True}],
        "train": {"batch_size": 2, "steps": steps, "lr": 1e-3, "optimizer": "adamw",
                  "max_grad_norm": 1.0, "gradient_checkpointing": False,
                  "cache_text_embeddings": True, "disable_sampling": True, "seed": 1},
        "model": {"arch": arch, "name_or_path": str(model_dir)},
    }]}}


def speeds(durations: list[float]) -> tuple[float, float]:
    """(steps/s at the 10th-percentile step time, steps/s at the median)."""
    ordered = sorted(durations)
    return 1.0 / ordered[len(ordered) // 10], 1.0 / statistics.median(ordered)


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]


def job_rate(root: Path, model_dir: Path, steps: int, name: str,
             arch: str) -> tuple[float, float]:
    import types

    from aitk.run import metrics

    loaded = parse_job(job_dict(root, model_dir, steps, name, arch), "bench.yml")
    # The loss log's timestamps, read from the chosen clock.
    metrics.time = types.SimpleNamespace(time=clock, perf_counter=time.perf_counter)
    try:
        with open(os.devnull, "w") as sink:
            assert run_job(loaded, stream=sink) == 0
    finally:
        metrics.time = time
    times = [json.loads(line)["time"] for line in
             (root / "out" / name / "loss_log.jsonl").read_text().splitlines()]
    return speeds([b - a for a, b in zip(times, times[1:], strict=False)])


def bare_rate(root: Path, model_dir: Path, steps: int, arch: str) -> tuple[float, float]:
    loaded = parse_job(job_dict(root, model_dir, steps, "bare", arch), "bench.yml")
    proc = loaded.job.config.process[0]
    model = load_model(proc, torch.device("cpu"))
    torch.manual_seed(1)
    network = create_network(model, proc)
    model.get_model_to_train().train()
    params = network.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    with torch.no_grad():
        side = SIDES[arch]
        pixels = torch.stack([torch.zeros(3, side, side), torch.ones(3, side, side) * 0.5])
        clean = model.encode_images(pixels)
        embeds = model.get_prompt_embeds(["image 1", "image 2"])
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        noise = torch.randn(clean.shape, generator=gen)
        t = torch.sigmoid(torch.randn(clean.shape[0], generator=gen)) * 1000
        s = (t / 1000).view(-1, 1, 1, 1)
        pred = model.get_noise_prediction((1 - s) * clean + s * noise, t, embeds)
        loss = torch.nn.functional.mse_loss(pred.float(), (noise - clean).float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    durations = []
    for _ in range(steps):
        start = clock()
        step()
        durations.append(clock() - start)
    return speeds(durations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arch", choices=sorted(SIDES), default="example")
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                        help="cpu: step times in this process's CPU time (all threads), "
                             "so other processes' load on a shared machine does not count")
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    target = 0.98 if args.arch == "flux" else 0.95

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["AITK_CACHE_DIR"] = str(root / "cache")
        make_dataset(root / "data", SIDES[args.arch])
        model_dir = build_model(args.arch, root / "model")
        ratios, median_ratios = [], []
        for r in range(args.rounds):
            (job, job_med) = job_rate(root, model_dir, args.steps, f"round{r}", args.arch)
            (bare, bare_med) = bare_rate(root, model_dir, args.steps, args.arch)
            ratios.append(job / bare)
            median_ratios.append(job_med / bare_med)
            print(f"round {r}: job {job:.2f} steps/s, bare {bare:.2f} steps/s, ratio "
                  f"{job / bare:.3f} (at median step times: {job_med / bare_med:.3f})",
                  flush=True)
    print(f"trainer/bare steps/s ratio (median of {args.rounds} rounds): "
          f"{statistics.median(ratios):.3f}  (target >= {target}; at median step times "
          f"{statistics.median(median_ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
