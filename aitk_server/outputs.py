"""What a job wrote in its output folder, read for the page: the loss log as points,
the sample gallery by step, the LoRA files."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
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


def _owned_files(out_dir: Path, name: str) -> list[Path]:
    """Files at the top of the output folder that aitk wrote (aitk.ownership)."""
    from aitk.metrics import is_loss_log
    from aitk.ownership import config_is_ours, lora_is_ours

    found = []
    for entry in out_dir.iterdir():
        if entry.is_symlink() or not entry.is_file():
            continue
        lora = re.fullmatch(re.escape(name) + r"(_[a-z_]+)?(_\d{9})?\.safetensors", entry.name)
        if ((lora and lora_is_ours(entry))
                or (entry.name == "config.yaml" and config_is_ours(entry))
                or (entry.name == "loss_log.jsonl" and is_loss_log(entry))
                or (entry.name == "status.json" and _is_status(entry))):
            found.append(entry)
    return found


def _is_status(path: Path) -> bool:
    try:
        fields = json.loads(path.read_bytes()[:1 << 20])
    except (OSError, ValueError):
        return False
    return isinstance(fields, dict) and {"schema_version", "phase", "step"} <= fields.keys()


def _owned_in(folder: Path, is_ours: Callable[[Path], bool]) -> list[Path]:
    if folder.is_symlink() or not folder.is_dir():
        return []
    return [entry for entry in folder.iterdir() if not entry.is_symlink() and is_ours(entry)]


def trainer_written(out_dir: Path, name: str) -> list[Path]:
    """What the trainer wrote in its output folder and nothing else (aitk.ownership): a
    config may point `training_folder` anywhere, and a user's file at one of the trainer's
    names (a picture in samples/, their own config.yaml) is theirs."""
    from aitk.checkpoint import is_ours as checkpoint_is_ours
    from aitk.ownership import image_is_ours

    if not out_dir.is_dir() or out_dir.is_symlink():
        return []
    return sorted([*_owned_files(out_dir, name),
                   *_owned_in(out_dir / "samples", image_is_ours),
                   *_owned_in(out_dir / "checkpoints", checkpoint_is_ours)])


def delete_outputs(out_dir: Path, name: str) -> list[str]:
    """Remove what the trainer wrote (paths relative to the output folder); a folder it
    made goes too when nothing else is left in it, and so does the output folder."""
    import shutil

    removed = []
    for entry in trainer_written(out_dir, name):
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.relative_to(out_dir).as_posix())
    for folder in (out_dir / "samples", out_dir / "checkpoints", out_dir):
        try:
            folder.rmdir()  # only when empty: someone else's files stay
        except OSError:
            pass
    return removed
