"""Benchmark: a no-op `python3 -m manager sync` against one `import torch`.

Run from the checkout root after a successful install:

    python3 bench/sync_noop.py [--runs 7]

It times the whole command as a user runs it (bootstrap, re-exec into .venv, detection,
plan) and `.venv/bin/python -c "import torch"`, prints medians, and checks the targets:
no-op sync under 0.5 s and under half of one torch import. Exit 1 when a target is missed
or the sync was not a no-op. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 0.5


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    env = dict(os.environ)
    python = ROOT / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    sync = [sys.executable, "-m", "manager", "sync", "--json"]
    _, first = timed(sync, env)  # warm the file cache; must already be a no-op
    if first.returncode != 0 or json.loads(first.stdout)["data"]["plan"]:
        print("the venv is not in sync; run `python3 -m manager install` first", file=sys.stderr)
        print(first.stdout[-2000:], first.stderr[-2000:], file=sys.stderr)
        return 1
    sync_times, torch_times = [], []
    for _ in range(args.runs):
        seconds, done = timed(sync, env)
        if done.returncode != 0 or json.loads(done.stdout)["data"]["plan"]:
            print("a run was not a no-op:", done.stdout[-2000:], file=sys.stderr)
            return 1
        sync_times.append(seconds)
        seconds, done = timed([str(python), "-c", "import torch"], env)
        if done.returncode != 0:
            print("import torch failed:", done.stderr[-2000:], file=sys.stderr)
            return 1
        torch_times.append(seconds)
    sync_median = statistics.median(sync_times)
    torch_median = statistics.median(torch_times)
    ratio = sync_median / torch_median
    print(f"no-op sync    median {sync_median:.3f}s  (min {min(sync_times):.3f}, "
          f"max {max(sync_times):.3f}, {args.runs} runs)")
    print(f"import torch  median {torch_median:.3f}s  (min {min(torch_times):.3f}, "
          f"max {max(torch_times):.3f})")
    print(f"ratio         {ratio:.2f} (target < 0.50); absolute target < {TARGET_SECONDS}s")
    ok = sync_median < TARGET_SECONDS and ratio < 0.5
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
