"""Does the example LoRA move previews toward the training images? (issue 14)

Builds a pre-trained example model (`--pretrain` recipe, cached in --work), trains the
example config on it with the given overrides, and prints the likeness measure
(aitk.models.example.likeness: mean absolute pixel distance to the nearest training
image, 0..1) of the previews at each sampled step and the reduction from step 0.

    .venv/bin/python bench/example_previews.py --work /tmp/ex \
        --set datasets.resolution=[32] --set sample.width=32 --set sample.height=32 \
        --set sample.guidance_scale=1.5 --set train.lr=1.5e-2
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
DATASET = REPO / "datasets" / "example"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--set", action="append", default=[],
                        help="SECTION.KEY=YAML_VALUE in the process (datasets.* sets the "
                             "first dataset)")
    args = parser.parse_args()
    model = args.work / "model"
    if not model.exists():
        from aitk.models.example.build import build_example_model
        from aitk.models.example.pretrain import PretrainPlan

        start = time.perf_counter()
        build_example_model(model, seed=0, pretrain=PretrainPlan())
        print(f"pre-training: {time.perf_counter() - start:.0f} s", flush=True)
    cfg = yaml.safe_load(CONFIG.read_text())
    proc = cfg["config"]["process"][0]
    proc["training_folder"] = str(args.work / "out")
    proc["model"]["name_or_path"] = str(model)
    proc["datasets"][0]["folder_path"] = str(DATASET)
    for item in args.set:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        target = proc["datasets"][0] if section == "datasets" else proc[section]
        target[name] = yaml.safe_load(value)
    path = args.work / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "run.py"), str(path)])
    print(f"training: {time.perf_counter() - start:.0f} s, exit {done.returncode}")
    samples = args.work / "out" / cfg["config"]["name"] / "samples"
    steps: dict[int, list[Path]] = {}
    for p in sorted(samples.iterdir()):
        steps.setdefault(int(p.name.split("_")[0]), []).append(p)
    first = mean_distance(steps[min(steps)], DATASET)
    for step, paths in sorted(steps.items()):
        print(f"step {step}: mean distance {mean_distance(paths, DATASET):.3f}")
    last = mean_distance(steps[max(steps)], DATASET)
    print(f"reduction from step 0: {1 - last / first:.0%}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
