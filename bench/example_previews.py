"""Does the example LoRA move previews toward the training images? (issue 14)

Trains the example config (config/examples/train_lora_example_cpu.yaml, on the shipped
pre-trained base aitk/models/example/base/ unless --model says otherwise) with the given
overrides and prints the likeness measure (aitk.models.example.likeness: mean absolute
pixel distance from each preview to the training image of its prompt, 0..1) at each
sampled step, and the reduction from step 0.

    .venv/bin/python bench/example_previews.py --work /tmp/ex
    .venv/bin/python bench/example_previews.py --work /tmp/ex --model /tmp/base \
        --set train.lr=3e-3 --set train.steps=400

`--model DIR` that does not exist is built first with the pre-training recipe
(`python -m aitk example-model DIR --pretrain`, about 33 minutes of one CPU core).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aitk.models.example.likeness import mean_distance  # noqa: E402

CONFIG = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"


def sample_steps(samples: Path) -> dict[int, dict[int, Path]]:
    """step -> prompt index -> preview, from the trainer's `STEP_INDEX.ext` names."""
    steps: dict[int, dict[int, Path]] = {}
    for path in sorted(samples.iterdir()):
        step, index = path.stem.split("_")[:2]
        steps.setdefault(int(step), {})[int(index)] = path
    return steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[],
                        help="SECTION.KEY=YAML_VALUE in the process (datasets.* sets the "
                             "first dataset)")
    args = parser.parse_args()
    cfg = yaml.safe_load(CONFIG.read_text())
    proc = cfg["config"]["process"][0]
    if args.model is not None:
        if not args.model.exists():
            from aitk.models.example.build import build_example_model
            from aitk.models.example.pretrain import PretrainPlan

            start = time.perf_counter()
            build_example_model(args.model, seed=0, pretrain=PretrainPlan())
            print(f"pre-training: {time.perf_counter() - start:.0f} s", flush=True)
        proc["model"]["name_or_path"] = str(args.model)
    else:
        proc["model"]["name_or_path"] = str(REPO / proc["model"]["name_or_path"])
    proc["training_folder"] = str(args.work / "out")
    dataset = REPO / proc["datasets"][0]["folder_path"]
    proc["datasets"][0]["folder_path"] = str(dataset)
    for item in args.set:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        target = proc["datasets"][0] if section == "datasets" else proc[section]
        target[name] = yaml.safe_load(value)
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "run.py"), str(path)])
    print(f"training: {time.perf_counter() - start:.0f} s, exit {done.returncode}")

    prompts = proc["sample"]["prompts"]
    trigger = proc.get("trigger_word") or ""
    steps = sample_steps(args.work / "out" / cfg["config"]["name"] / "samples")
    distances = {step: mean_distance([(p, prompts[i]) for i, p in previews.items()],
                                     dataset, trigger)
                 for step, previews in sorted(steps.items())}
    for step, value in distances.items():
        print(f"step {step}: mean distance {value:.3f}")
    first, last = distances[min(distances)], distances[max(distances)]
    print(f"reduction from step 0: {1 - last / first:.0%}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
