"""Benchmark: a no-op `python3 -m manager sync` against uv's own no-op and one
`import torch`.

Run from the checkout root after a successful install:

    python3 bench/sync_noop.py [--runs 7]

It times the whole command as a user runs it (bootstrap, re-exec into .venv, detection,
plan), uv's no-op over the same venv (`uv pip install -r <the spec's requirements file>`,
everything already there) and `.venv/bin/python -c "import torch"`, interleaved, prints
medians, and checks the targets: no-op sync under 0.5 s, under half of one torch import,
and at most 5x uv's no-op (skipped without uv). Exit 1 when a target is missed or the
sync was not a no-op. Not a test: timings depend on the machine (the interpreter's own
start-up, which uv does not pay, is part of the sync's figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 0.5
UV_TARGET = 5.0


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
    local_uv = ROOT / ".uv" / ("uv.exe" if os.name == "nt" else "uv")
    uv = local_uv if local_uv.exists() else shutil.which("uv")
    requirements = json.loads(first.stdout)["data"]["spec"]["requirements_file"]
    uv_noop = [str(uv), "pip", "install", "--python", str(python), "-q", "-r",
               str(ROOT / requirements)] if uv else None
    sync_times, torch_times, uv_times = [], [], []
    for _ in range(args.runs):
        if uv_noop:
            seconds, done = timed(uv_noop, env)
            if done.returncode != 0:
                print("uv's no-op failed:", done.stderr[-2000:], file=sys.stderr)
                return 1
            uv_times.append(seconds)
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
    if uv_times:
        uv_median = statistics.median(uv_times)
        print(f"uv's no-op    median {uv_median:.3f}s; sync / uv {sync_median / uv_median:.1f}x"
              f" (target <= {UV_TARGET:g}x)")
        ok = ok and sync_median <= UV_TARGET * uv_median
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
