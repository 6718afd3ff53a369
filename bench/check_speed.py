"""Benchmark: `python run.py CONFIG --check` (the preflight alone) against one
`import torch`.

Run from the checkout root after an install:

    .venv/bin/python bench/check_speed.py [--runs 7] [--config FILE]

It times the whole command as a user runs it, prints medians, and checks the targets:
`--check` on the bundled example in under 5 s ("a few seconds") and in under half the
time of importing torch (it must not import torch when the config asks for nothing that
needs it). Exit 1 when a target is missed or the check failed. Not a test: timings
depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config" / "examples" / "train_lora_example_cpu.yaml"
TARGET_SECONDS = 5.0


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--config", type=Path, default=EXAMPLE)
    args = parser.parse_args()
    check = [sys.executable, str(ROOT / "run.py"), str(args.config), "--check"]
    torch_import = [sys.executable, "-c", "import torch"]
    timed(check), timed(torch_import)  # warm the file cache
    checks, imports = [], []
    for _ in range(args.runs):
        seconds, done = timed(check)
        if done.returncode != 0:
            print(f"--check failed (exit {done.returncode}): {done.stderr.strip()}")
            return 1
        checks.append(seconds)
        imports.append(timed(torch_import)[0])
    c, t = statistics.median(checks), statistics.median(imports)
    print(f"run.py --check: median {c:.3f} s over {args.runs} runs")
    print(f"import torch:   median {t:.3f} s")
    ok = c < TARGET_SECONDS and c < t / 2
    print(f"targets (< {TARGET_SECONDS} s and < half a torch import): "
          f"{'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
