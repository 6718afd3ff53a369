"""Checkpoints: one directory per save, published by an atomic rename.

    training_folder/NAME/checkpoints/step_000000250/
        adapter.safetensors   adapter weights, internal names, full precision
        optimizer.pt          optimizer state
        rng.pt                python / numpy / torch CPU (+ CUDA) generator states
        state.json            step, epoch, data-order position, LR schedule, job name
        manifest.json         sha256 of every file above; written last

The directory is assembled as `.tmp-step_...` beside its final name (every file
fsync'd), then renamed into place, so a crash or a second Ctrl+C leaves either the old
set of checkpoints or the new one, never a torn checkpoint. Resume takes the newest
directory whose manifest validates and reports any it skips. Old checkpoints are pruned
only after the new one is published.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aitk.files import fsync_dir, publish_dir

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "step_"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"


class CorruptCheckpoint(Exception):
    pass


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int

    def read(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def state(self) -> dict:
        return json.loads(self.read("state.json"))


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def save_checkpoint(root: Path, step: int, files: Mapping[str, bytes]) -> Checkpoint:
    """Publish `files` as the checkpoint for `step`; returns it once durable."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / dir_name(step)
    tmp = root / f"{TMP_PREFIX}{dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        digests = {}
        for name, data in files.items():
            _write_synced(tmp / name, data)
            digests[name] = hashlib.sha256(data).hexdigest()
        manifest = {"format": FORMAT, "step": step, "files": digests}
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        fsync_dir(tmp)
        # Re-saving a step moves the old one aside first (clean_stale finds OLD_PREFIX).
        publish_dir(tmp, final, old=root / f"{OLD_PREFIX}{final.name}-{os.getpid()}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Checkpoint(final, step)


def validate(path: Path) -> Checkpoint:
    """The checkpoint at `path`, or CorruptCheckpoint saying what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint("no manifest (incomplete save)") from None
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptCheckpoint(f"unknown checkpoint format {manifest!r:.60}")
    for name, digest in manifest.get("files", {}).items():
        try:
            data = (path / name).read_bytes()
        except OSError:
            raise CorruptCheckpoint(f"{name} is missing") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptCheckpoint(f"{name} does not match its checksum")
    return Checkpoint(path, int(manifest["step"]))


def _published(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]), reverse=True)


def find_resumable(root: Path, report: Callable[[str], None] = print) -> Checkpoint | None:
    """The newest checkpoint that validates; corrupt ones are reported and skipped."""
    for path in _published(root):
        try:
            return validate(path)
        except CorruptCheckpoint as exc:
            report(f"skipping checkpoint {path.name}: {exc}")
    return None


def clean_stale(root: Path) -> None:
    """Remove leftovers of interrupted saves (never a published checkpoint)."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((TMP_PREFIX, OLD_PREFIX)):
                shutil.rmtree(p, ignore_errors=True)


def prune(root: Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` checkpoints; returns the deleted steps."""
    removed = []
    for path in _published(root)[keep:]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(int(path.name[len(PREFIX):]))
    return removed


# ---- RNG state: everything random that a step may touch -------------------------------
def capture_rng() -> dict:
    """Global generators. The trainer's own draws use seeded per-step generators; these
    cover what models do on their own (LoRA dropout, stochastic layers)."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    # Plain types only, so the file loads with torch.load(weights_only=True).
    state = {"python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
