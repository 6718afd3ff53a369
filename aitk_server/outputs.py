"""What a job wrote in its output folder, read for the page: the loss log as points,
the sample gallery by step, the LoRA files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SAMPLE = re.compile(r"^(\d{9})_(\d+)\.(png|jpg|jpeg|webp)$")
STEP_LORA = re.compile(r"_(\d{9})\.safetensors$")
MAX_LOG_BYTES = 64 * 1024 * 1024


def loss_points(out_dir: Path, max_points: int = 1000) -> list[list[float]]:
    """[[step, loss], ...], evenly thinned to at most max_points (the last kept).
    A torn last line (a killed trainer) is skipped."""
    path = out_dir / "loss_log.jsonl"
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_LOG_BYTES)
    except OSError:
        return []
    points = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
            points.append([int(entry["step"]), float(entry["loss"])])
        except (ValueError, KeyError, TypeError):
            continue
    if len(points) > max_points > 0:
        stride = len(points) / max_points
        thinned = [points[int(i * stride)] for i in range(max_points - 1)]
        points = [*thinned, points[-1]]
    return points


def samples(out_dir: Path) -> list[dict[str, Any]]:
    folder = out_dir / "samples"
    by_step: dict[int, list[str]] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        found = SAMPLE.match(path.name)
        if found:
            by_step.setdefault(int(found.group(1)), []).append(f"samples/{path.name}")
    return [{"step": step, "files": files} for step, files in sorted(by_step.items())]


def loras(out_dir: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(out_dir.glob("*.safetensors")) if out_dir.is_dir() else []:
        if not path.name.startswith(name):
            continue
        step = STEP_LORA.search(path.name)
        out.append({"file": path.name, "size": path.stat().st_size,
                    "step": int(step.group(1)) if step else None,
                    "final": path.name == f"{name}.safetensors"})
    return out


TRAINER_FILES = ("config.yaml", "loss_log.jsonl", "status.json")
TRAINER_DIRS = ("checkpoints", "samples")


def trainer_written(out_dir: Path, name: str) -> list[Path]:
    """What the trainer writes in its output folder, and nothing else: a config may
    point `training_folder` anywhere, so deleting outputs never means deleting a folder
    wholesale."""
    if not out_dir.is_dir() or out_dir.is_symlink():
        return []
    found = []
    for entry in out_dir.iterdir():
        lora = re.fullmatch(re.escape(name) + r"(_\d{9})?\.safetensors", entry.name)
        if entry.is_symlink():
            continue
        if (entry.is_file() and (entry.name in TRAINER_FILES or lora)) or (
                entry.is_dir() and entry.name in TRAINER_DIRS):
            found.append(entry)
    return sorted(found)


def delete_outputs(out_dir: Path, name: str) -> list[str]:
    """Remove what the trainer wrote; the folder too when nothing else is left."""
    import shutil

    removed = []
    for entry in trainer_written(out_dir, name):
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.name)
    try:
        out_dir.rmdir()  # only when empty: someone else's files stay
    except OSError:
        pass
    return removed
