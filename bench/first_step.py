"""Benchmark: time to the first training step of the tiny Flux example, with and without
compiled bytecode.

Run from the checkout root after a successful install:

    .venv/bin/python bench/first_step.py [--runs 3]

Runs `run.py` on `config/examples/train_lora_flux_tiny_cpu.yaml` (one step, no samples,
everything it writes in a temporary folder) as whole processes and takes the time from
the launch to the first step's entry in the loss log. Both sides run with
PYTHONDONTWRITEBYTECODE=1 (nothing is compiled for the next start) and their own
PYTHONPYCACHEPREFIX, so the venv's own bytecode, whatever its state, is not used:

- no bytecode: the prefix holds the standard library's bytecode only, so every package
  (diffusers, transformers, torch's Python) is compiled from source at each start, as a
  venv installed without bytecode runs where .pyc files cannot be written;
- compiled:    the same prefix after one run that was allowed to write, so everything
  the job imports has bytecode, as after `uv pip install --compile-bytecode`.

A first run (not timed) builds the tiny model and the latent caches. Runs alternate
between the sides so background load hits both alike; prints each side's median and
the ratio (no bytecode / compiled). Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config" / "examples" / "train_lora_flux_tiny_cpu.yaml"


def job_config(work: Path) -> Path:
    """The example job, one step, writing only under `work`."""
    job = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    process = job["config"]["process"][0]
    process["training_folder"] = str(work / "output")
    process["datasets"][0]["folder_path"] = str(ROOT / "datasets" / "example")
    process["model"]["name_or_path"] = str(work / "flux-tiny")
    process["train"].update(steps=1, disable_sampling=True)
    process["save"]["save_every"] = 1000
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def first_step(config: Path, work: Path, prefix: Path, write: bool) -> float:
    """Seconds from the launch to the first step's entry in the loss log."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix),
           "AITK_CACHE_DIR": str(work / "cache"), "NO_COLOR": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    run = work / "output" / "flux_tiny_lora"
    shutil.rmtree(run, ignore_errors=True)  # a checkpoint there would resume, past step 1
    log = run / "loss_log.jsonl"
    started = time.time()
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), str(config)], cwd=work,
                          env=env, capture_output=True, text=True)
    if done.returncode != 0 or not log.exists():
        sys.exit(f"the job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(log.read_text(encoding="utf-8").splitlines()[0])["time"] - started


def stdlib_bytecode(prefix: Path) -> None:
    """The standard library compiled into `prefix` (a system Python ships it)."""
    before, sys.pycache_prefix = sys.pycache_prefix, str(prefix)  # where compileall writes
    skip = re.compile(r"site-packages|[/\\](tests?|lib2to3|idlelib)[/\\]")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old syntax in test data, not ours
            for folder in {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}:
                compileall.compile_dir(folder, quiet=2, workers=0, rx=skip)
    finally:
        sys.pycache_prefix = before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aitk-first-step-") as tmp:
        work = Path(tmp)
        config = job_config(work)
        bare, compiled = work / "pyc-stdlib", work / "pyc-all"
        print("compiling the standard library's bytecode ...", file=sys.stderr)
        stdlib_bytecode(bare)
        shutil.copytree(bare, compiled)
        print("first run: the tiny model, the caches and the bytecode ...", file=sys.stderr)
        first_step(config, work, compiled, write=True)
        times: dict[str, list[float]] = {"no bytecode": [], "compiled": []}
        for _ in range(args.runs):
            times["no bytecode"].append(first_step(config, work, bare, write=False))
            times["compiled"].append(first_step(config, work, compiled, write=False))
    medians = {side: statistics.median(seconds) for side, seconds in times.items()}
    print(f"{'time to the first step':24} {'median s':>9} {'min s':>7}")
    for side, seconds in times.items():
        print(f"{side:24} {medians[side]:9.2f} {min(seconds):7.2f}")
    print(f"ratio (no bytecode / compiled): {medians['no bytecode'] / medians['compiled']:.2f}"
          f"  ({args.runs} runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
