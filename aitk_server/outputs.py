"""What a job wrote in its output folder, read for the page: the loss log as points,
the sample gallery by step, the LoRA files, and the one file the file route serves.

Only files the trainer wrote are served or deleted, whatever else the folder holds: its
ownership marks say which (aitk.run.ownership: LoRA metadata, the previews' EXIF mark, the
config header, an mp4 preview's container tag; aitk.run.metrics and aitk.run.checkpoint for
the loss log and checkpoints). They are imported in one place, `_owners()`. Previews are
served inline with their own type (a video preview is an animated WebP, and an mp4 with
its sound beside it when the arch makes sound); everything else as a download; nothing
ever as HTML, so no file can run as a page of the UI's origin.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

from aitk.config.kinds import FILE_KINDS

SAMPLE = re.compile(r"^(\d{9})_(\d+)\.(png|jpg|jpeg|webp)$")
# A video's strip and its mp4 with sound too.
SERVED_SAMPLE = re.compile(r"^\d{9}_\d+(_strip)?\.(png|jpg|jpeg|webp)$|^\d{9}_\d+\.mp4$")
STEP_LORA = re.compile(r"_(\d{9})\.safetensors$")
MAX_LOG_BYTES = 64 * 1024 * 1024
INLINE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
                ".webp": "image/webp", ".mp4": "video/mp4"}
DOWNLOAD_TYPE = "application/octet-stream"


def _owners() -> SimpleNamespace:
    """aitk's ownership checks: every import from the trainer's modules is here."""
    from aitk.run.checkpoint import is_ours as checkpoint
    from aitk.run.metrics import is_loss_log
    from aitk.run.ownership import (
        config_is_ours,
        image_is_ours,
        lora_is_ours,
        preview_is_ours,
    )

    return SimpleNamespace(lora=lora_is_ours, image=image_is_ours, preview=preview_is_ours,
                           config=config_is_ours, loss_log=is_loss_log, checkpoint=checkpoint)


def _lora_name(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(name) + r"(_[a-z_]+)?(_\d{9})?\.safetensors")


@dataclass(frozen=True)
class Served:
    path: Path
    media_type: str
    inline: bool  # shown in the page (a preview); else a download




def _file_job_output(path: Path) -> Served | None:
    """A file job's output (its folder's top level holds what it made, under names of
    its own) as it is served: an image it made (aitk's EXIF mark) inline,
    a LoRA or model file it wrote (aitk's metadata) as a download."""
    owners = _owners()
    kind = INLINE_TYPES.get(path.suffix.lower())
    if kind and owners.image(path):
        return Served(path, kind, True)
    if path.suffix == ".safetensors" and owners.lora(path):
        return Served(path, DOWNLOAD_TYPE, False)
    return None


def file_job_outputs(out_dir: Path) -> list[dict[str, Any]]:
    """What a file job wrote at the top of its folder: [{file, size, inline}]."""
    if not out_dir.is_dir() or out_dir.is_symlink():
        return []
    out = []
    for path in sorted(out_dir.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        found = _file_job_output(path)
        if found is not None:
            out.append({"file": path.name, "size": path.stat().st_size,
                        "inline": found.inline})
    return out


def served_file(out_dir: Path, name: str, relative: str,
                kind: str = "extension") -> Served | None:
    """The file `relative` of a job's output folder when the trainer wrote it, with how to
    send it; None for anything else (a user's file, a link, a folder, a path out).
    `kind`: the job's kind (a file job's outputs have names of their own)."""
    rel = PurePosixPath(relative)
    if rel.is_absolute() or not rel.parts or any(p in ("", ".", "..") for p in rel.parts) \
            or "\\" in relative or "\0" in relative:
        return None
    path = out_dir.joinpath(*rel.parts)
    if out_dir.is_symlink() or path.parent.is_symlink() or path.is_symlink() \
            or not path.is_file():
        return None  # the trainer never writes links; one may lead anywhere
    owners = _owners()
    parts = rel.parts
    if len(parts) == 2 and parts[0] == "samples":
        kind = INLINE_TYPES.get(path.suffix.lower())
        if kind and SERVED_SAMPLE.match(parts[1]) and owners.preview(path):
            return Served(path, kind, True)
        return None
    if len(parts) != 1:
        return None
    if kind in FILE_KINDS:
        return _file_job_output(path)
    if (_lora_name(name).fullmatch(parts[0]) and owners.lora(path)) \
            or (parts[0] == "config.yaml" and owners.config(path)) \
            or (parts[0] == "loss_log.jsonl" and owners.loss_log(path)):
        return Served(path, DOWNLOAD_TYPE, False)
    return None


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


def previews(out_dir: Path, sample: Any, trigger: str | None) -> list[dict[str, Any]]:
    """The previews per prompt across steps, with the prompt and seed each was made
    with: [{index, prompt, seed, steps: [{step, file, sound}]}]; `sound` is the step's mp4
    with sound, or None (an arch without sound). `sample` is the job's SampleConfig; the
    seed rule is the trainer's (aitk.run.sampling.image_configs)."""
    items = sample.items if sample is not None else []
    is_ours = _owners().preview
    by_index: dict[int, list[dict[str, Any]]] = {}
    for entry in samples(out_dir):
        for file in entry["files"]:
            found = SAMPLE.match(PurePosixPath(file).name)
            if found:
                mp4 = PurePosixPath(file).with_suffix(".mp4")
                by_index.setdefault(int(found.group(2)), []).append(
                    {"step": entry["step"], "file": file,
                     "sound": str(mp4) if is_ours(out_dir / mp4) else None})
    out = []
    for index in sorted(set(by_index) | set(range(len(items)))):
        item = items[index] if index < len(items) else None
        seed = sample.seed + index if sample is not None and sample.walk_seed else \
            getattr(sample, "seed", None)
        prompt = item.prompt.replace("[trigger]", trigger or "").strip() if item else None
        out.append({"index": index, "prompt": prompt,
                    "seed": item.seed if item and item.seed is not None else seed,
                    "steps": by_index.get(index, [])})
    return out


def loras(out_dir: Path, name: str) -> list[dict[str, Any]]:
    """The LoRA files the trainer wrote (a user's file beside them is not listed)."""
    out = []
    pattern, is_ours = _lora_name(name), _owners().lora
    for path in sorted(out_dir.glob("*.safetensors")) if out_dir.is_dir() else []:
        if not pattern.fullmatch(path.name) or not is_ours(path):
            continue
        step = STEP_LORA.search(path.name)
        out.append({"file": path.name, "size": path.stat().st_size,
                    "step": int(step.group(1)) if step else None,
                    "final": path.name == f"{name}.safetensors"})
    return out


def _owned_files(out_dir: Path, name: str) -> list[Path]:
    """Files at the top of the output folder that aitk wrote."""
    owners, pattern = _owners(), _lora_name(name)
    found = []
    for entry in out_dir.iterdir():
        if entry.is_symlink() or not entry.is_file():
            continue
        if ((pattern.fullmatch(entry.name) and owners.lora(entry))
                or (entry.name == "config.yaml" and owners.config(entry))
                or (entry.name == "loss_log.jsonl" and owners.loss_log(entry))
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


def trainer_written(out_dir: Path, name: str, kind: str = "extension") -> list[Path]:
    """What the trainer wrote in its output folder and nothing else (aitk.run.ownership): a
    config may point `training_folder` anywhere, and a user's file at one of the trainer's
    names (a picture in samples/, their own config.yaml) is theirs."""
    owners = _owners()
    if not out_dir.is_dir() or out_dir.is_symlink():
        return []
    if kind in FILE_KINDS:
        return [out_dir / f["file"] for f in file_job_outputs(out_dir)]
    return sorted([*_owned_files(out_dir, name),
                   *_owned_in(out_dir / "samples", owners.preview),
                   *_owned_in(out_dir / "checkpoints", owners.checkpoint)])


def delete_outputs(out_dir: Path, name: str, kind: str = "extension") -> list[str]:
    """Remove what the trainer wrote (paths relative to the output folder); a folder it
    made goes too when nothing else is left in it, and so does the output folder."""
    import shutil

    removed = []
    for entry in trainer_written(out_dir, name, kind):
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
