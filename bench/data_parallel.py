"""Data-parallel throughput: samples/s of one process against N processes (torchrun).

    .venv/bin/python bench/data_parallel.py [--procs 2] [--steps 40] [--rounds 3]

Both sides train the tiny `example` model on the same global batch: one process with
`gradient_accumulation: N`, and N processes (`run.py --gpus N`; gloo on a CPU, NCCL on
GPUs) with accumulation 1, which trains exactly the same thing (tests/aitk/
test_distributed.py). Speed is taken from the loss log's per-step timestamps, first
logged step to last, so start-up, model loading and caching are left out. Rounds
alternate the sides so background load hits both alike; the figure is the median of
the per-round ratios N-process / one-process samples/s.

On this project's 2-core CI machine the ratio is at most ~1: two processes share the
same two cores that one process's intra-op threads already use, and the all-reduce is
extra work. The point of running it there is that it runs; on a GPU machine it measures
the scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def config(out: Path, model: Path, name: str, steps: int, accumulation: int) -> Path:
    job = {"job": "extension", "config": {"name": name, "process": [{
        "type": "sd_trainer", "training_folder": str(out), "device": "cpu",
        "network": {"type": "lora", "linear": 8, "linear_alpha": 8},
        "save": {"dtype": "float32", "save_every": 10_000, "max_step_saves_to_keep": 1},
        "datasets": [{"folder_path": str(REPO / "datasets" / "example"),
                      "resolution": [64], "cache_latents_to_disk": True}],
        "train": {"batch_size": 2, "steps": steps, "lr": 1e-3,
                  "gradient_accumulation": accumulation, "gradient_checkpointing": False,
                  "cache_text_embeddings": True, "disable_sampling": True, "seed": 1},
        "model": {"arch": "example", "name_or_path": str(model)}}]},
        "meta": {"name": "[name]"}}
    path = out / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def samples_per_s(cfg: Path, out: Path, name: str, procs: int, global_batch: int) -> float:
    extra = ["--gpus", str(procs)] if procs > 1 else []
    subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg), *extra], check=True,
                   cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = [json.loads(line)["time"] for line in
             (out / name / "loss_log.jsonl").read_text().splitlines()]
    return (len(times) - 1) * global_batch / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("AITK_CACHE_DIR", tempfile.mkdtemp(prefix="aitk-bench-cache-"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = root / "model"
        subprocess.run([sys.executable, "-m", "aitk", "example-model", str(model)],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        global_batch = 2 * args.procs
        ratios = []
        for r in range(args.rounds):
            one = samples_per_s(config(root, model, f"one{r}", args.steps, args.procs),
                                root, f"one{r}", 1, global_batch)
            many = samples_per_s(config(root, model, f"many{r}", args.steps, 1), root,
                                 f"many{r}", args.procs, global_batch)
            ratios.append(many / one)
            print(f"round {r + 1}: 1 process {one:.2f} samples/s, {args.procs} processes "
                  f"{many:.2f} samples/s, ratio {many / one:.3f}", flush=True)
        print(f"median ratio {args.procs} processes / 1 process: "
              f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
