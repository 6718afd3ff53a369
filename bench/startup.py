"""Benchmark: how fast the trainer answers before any training starts.

Run from the checkout root after a successful install:

    .venv/bin/python bench/startup.py [--runs 5]

Times, as whole processes, a config error (`run.py` on a config with a misspelt key)
and `python -m aitk models --json`, side by side with importing the heavy libraries
they no longer import (`import torch, diffusers, transformers`: what both used to pay
first). Prints the median and the fastest run of each. Exit 1 when a median exceeds the
target (2 s). Not a test: timings depend on the machine; tests/aitk/test_startup.py
checks the import graph instead.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 2.0
BAD_CONFIG = ("job: extension\nconfig:\n  name: bench\n  process:\n"
              "    - type: sd_trainer\n      netwrk: {type: lora}\n")


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bad.yaml"
        config.write_text(BAD_CONFIG)
        cases = {
            "config error (run.py)": ([sys.executable, "run.py", str(config)], True),
            "python -m aitk models": ([sys.executable, "-m", "aitk", "models", "--json"],
                                      True),
            "import torch, diffusers, transformers": (
                [sys.executable, "-c", "import torch, diffusers, transformers"], False),
        }
        for argv, _ in cases.values():  # warm the file cache
            timed(argv)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):  # interleaved, so drift hits every case alike
            for name, (argv, _) in cases.items():
                times[name].append(timed(argv))
    missed = False
    print(f"{'command':40} {'median s':>9} {'min s':>7}  target")
    for name, (_, checked) in cases.items():
        median = statistics.median(times[name])
        verdict = ""
        if checked:
            ok = median < TARGET_SECONDS
            missed |= not ok
            verdict = f"< {TARGET_SECONDS:g} s {'ok' if ok else 'MISSED'}"
        print(f"{name:40} {median:9.2f} {min(times[name]):7.2f}  {verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
