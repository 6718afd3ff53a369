"""Checkpoints: one directory per save, published by an atomic rename.

    training_folder/NAME/checkpoints/step_000000250/
        adapter.safetensors   adapter weights, internal names, full precision
        weights*.safetensors  instead, for a full fine-tune: the trained parameters as
                              they are in memory, sharded (+ weights.safetensors.index.json)
        optimizer.pt          optimizer state
        rng.pt                python / numpy / torch CPU (+ CUDA) generator states
        state.json            step, epoch, data-order position, LR schedule, job name
        ema.pt                with train.ema_config: the adapter's moving average
        manifest.json         sha256 of every file above; written last

The directory is assembled as `.tmp-step_...` beside its final name (every file
fsync'd), then renamed into place, so a crash or a second Ctrl+C leaves either the old
set of checkpoints or the new one, never a torn checkpoint. Resume takes the newest
directory whose manifest validates; a `step_*` directory that does not validate is set
aside (renamed `invalid-step_...`, reported), never deleted, so pruning can never remove
a good checkpoint to keep a bad one. Old checkpoints are pruned only after the new one
is published.

Only what this module recognises as its own is ever removed: a directory named exactly
like one of its checkpoints (or temp/old folders) whose files are all checkpoint files
(and, for a published one, listed in its manifest). Anything else in `checkpoints/`
(`step_1/`, `.tmp-notes/`, a user's folder) is left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aitk.errors import CorruptCheckpoint
from aitk_common.files import disk_full, fsync_dir, is_disk_full, publish_dir, sha256_file

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "step_"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
INVALID_PREFIX = "invalid-"
# The files the trainer puts in a checkpoint (aitk.run.saving.checkpoint_files; ema.pt
# with train.ema_config; weights*.safetensors for a full fine-tune) + the manifest.
FILES = frozenset({"adapter.safetensors", "optimizer.pt", "rng.pt", "state.json", "ema.pt",
                   MANIFEST, "weights.safetensors", "weights.safetensors.index.json"})
_SHARD = re.compile(r"weights-\d{5}-of-\d{5}\.safetensors")
_PUBLISHED = re.compile(r"step_(\d{9})")
_STALE = re.compile(r"\.(tmp|old)-step_\d{9}-\d+")
# A file's content: bytes, or a writer that writes it at the path it is given (for
# content too large to hold twice: a full fine-tune's weights and optimizer state).
Content = bytes | Callable[[Path], None]


def is_checkpoint_file(name: str) -> bool:
    return name in FILES or bool(_SHARD.fullmatch(name))


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int

    def read(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def state(self) -> dict:
        return json.loads(self.read("state.json"))


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def _write_synced(path: Path, data: Content) -> None:
    if callable(data):
        data(path)
        with open(path, "rb+") as fh:
            os.fsync(fh.fileno())
        return
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def save_checkpoint(root: Path, step: int, files: Mapping[str, Content],
                    expected_bytes: int | None = None) -> Checkpoint:
    """Publish `files` as the checkpoint for `step`; returns it once durable."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / dir_name(step)
    tmp = root / f"{TMP_PREFIX}{dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        _remove_if_ours(tmp)
    tmp.mkdir()
    try:
        digests = {}
        for name, data in files.items():
            _write_synced(tmp / name, data)
            digests[name] = (sha256_file(tmp / name) if callable(data)
                             else hashlib.sha256(data).hexdigest())
        manifest = {"format": FORMAT, "step": step, "files": digests}
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        fsync_dir(tmp)
        # Re-saving a step moves the old one aside first (clean_stale finds OLD_PREFIX).
        publish_dir(tmp, final, old=root / f"{OLD_PREFIX}{final.name}-{os.getpid()}")
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full(root, expected_bytes or sum(
                len(d) for d in files.values() if not callable(d))) from None
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
            actual = sha256_file(path / name)  # in chunks: shards are gigabytes
        except OSError:
            raise CorruptCheckpoint(f"{name} is missing") from None
        if actual != digest:
            raise CorruptCheckpoint(f"{name} does not match its checksum")
    return Checkpoint(path, int(manifest["step"]))


def _published(root: Path) -> list[Path]:
    """`step_#########` directories (exactly the names dir_name makes), newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _PUBLISHED.fullmatch(p.name)
             and p.is_dir() and not p.is_symlink()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]), reverse=True)


def _only_checkpoint_files(path: Path, allowed: frozenset[str] | None = None) -> bool:
    """A real directory holding nothing but regular files named in `allowed` (default:
    the names the trainer gives checkpoint files)."""
    def named(name: str) -> bool:
        return is_checkpoint_file(name) if allowed is None else name in allowed

    try:
        if path.is_symlink() or not path.is_dir():
            return False
        return all(named(e.name) and stat.S_ISREG(e.stat(follow_symlinks=False).st_mode)
                   for e in os.scandir(path))
    except OSError:
        return False


def is_ours(path: Path) -> bool:
    """A published checkpoint this module wrote: its manifest lists every file in it."""
    try:
        manifest = json.loads((path / MANIFEST).read_bytes()[:1 << 20])
        listed = frozenset(manifest["files"]) | {MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return manifest.get("format") == FORMAT and _only_checkpoint_files(path, listed)


def set_aside(path: Path) -> Path:
    """Rename an invalid checkpoint out of the resume and prune set; returns the new path."""
    n = 1
    target = path.with_name(f"{INVALID_PREFIX}{path.name}")
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{INVALID_PREFIX}{path.name}-{n}")
    os.replace(path, target)
    return target


def set_aside_earlier(root: Path) -> list[Path]:
    """Checkpoints set aside by this or an earlier start (`invalid-step_*`)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(INVALID_PREFIX + PREFIX))


def find_resumable(root: Path, report: Callable[[str], None] = print) -> Checkpoint | None:
    """The newest checkpoint that validates. Each newer one that does not is reported and
    set aside (renamed), so neither resume nor pruning counts it again."""
    for path in _published(root):
        try:
            return validate(path)
        except CorruptCheckpoint as exc:
            try:
                aside = set_aside(path)
            except OSError as err:
                raise CorruptCheckpoint(f"checkpoint {path} does not validate ({exc}) "
                                        f"and cannot be set aside ({err})") from None
            report(f"skipping checkpoint {path.name}: {exc}; set aside as {aside.name}")
    return None


def _remove_if_ours(path: Path) -> bool:
    if _only_checkpoint_files(path):
        shutil.rmtree(path, ignore_errors=True)
        return True
    return False


def clean_stale(root: Path) -> None:
    """Remove leftovers of interrupted saves: only `.tmp-step_...-PID`/`.old-step_...-PID`
    folders holding nothing but checkpoint files (never a published checkpoint, never
    anything else)."""
    if root.is_dir():
        for p in root.iterdir():
            if _STALE.fullmatch(p.name):
                _remove_if_ours(p)


def prune(root: Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` checkpoints; returns the deleted steps. Only
    checkpoints that carry this module's manifest count and are deleted."""
    removed = []
    for path in [p for p in _published(root) if is_ours(p)][keep:]:
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
