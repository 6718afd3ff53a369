"""Benchmark: what a trainer process would save by not importing `torch._dynamo`.

Run from the checkout root after a successful install:

    .venv/bin/python bench/dynamo_import.py [--runs 3]

`import diffusers` imports `torch._dynamo` (diffusers.utils.torch_utils takes
`allow_in_graph` from it, at the top of the package, so no diffusers submodule escapes
it). This times, each in a fresh process (median of --runs), `import torch`, then
`torch._dynamo` on top of it, then what the trainer itself imports, and asks which
library pulls `torch._dynamo` in first. Every LoRA the trainer makes goes through peft,
and peft imports transformers, which imports `torch._dynamo` too (its masking and
generation utilities): then skipping it in diffusers alone saves nothing. Prints each
time, its ratio to `import torch`, and the verdict. Not a test: timings depend on the
machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Prints the import time, whether torch._dynamo got loaded, and the libraries (outermost
# first) that were being imported when it was.
PROBE = r"""
import importlib, json, sys, time, traceback
first = []
class Spy:
    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo" and not first:
            stack = [f.filename for f in traceback.extract_stack()]
            outside = [s.split("site-packages/")[-1].split("/")[0] for s in stack
                       if "site-packages/" in s and "/torch/" not in s]
            chain = [p for i, p in enumerate(outside) if p not in outside[:i]]
            first.append(" -> ".join(chain) or "torch")
        return None
sys.meta_path.insert(0, Spy())
start = time.perf_counter()
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "dynamo": "torch._dynamo" in sys.modules,
                  "first": first[0] if first else None}))
"""

CASES = {
    "import torch": ["torch"],
    "import torch, torch._dynamo": ["torch", "torch._dynamo"],
    "import diffusers": ["diffusers"],
    "import peft (the trainer's LoRA)": ["peft"],
    "the trainer's imports (job, example arch, LoRA)": [
        "aitk.job", "aitk.models.example", "aitk.adapters.network"],
}


def measure(modules: list[str], runs: int) -> dict:
    results = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", PROBE, *modules], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout))
    return {"seconds": statistics.median(r["seconds"] for r in results),
            "dynamo": results[0]["dynamo"], "first": results[0]["first"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    found = {name: measure(modules, args.runs) for name, modules in CASES.items()}
    base = found["import torch"]["seconds"]
    for name, r in found.items():
        via = f", pulled in by {r['first']}" if r["dynamo"] else ""
        print(f"{name:50s} {r['seconds']:6.2f} s  {r['seconds'] / base:4.2f}x torch  "
              f"torch._dynamo loaded: {'yes' if r['dynamo'] else 'no'}{via}")
    dynamo = found["import torch, torch._dynamo"]["seconds"] - base
    print(f"torch._dynamo on top of torch: {dynamo:.2f} s")
    if found["import peft (the trainer's LoRA)"]["dynamo"]:
        print("verdict: peft imports torch._dynamo itself (through transformers), so a "
              "trainer that skipped it in diffusers would still pay it: saves 0 s")
    else:
        print(f"verdict: skipping torch._dynamo in diffusers could save up to {dynamo:.2f} s "
              "per trainer process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
