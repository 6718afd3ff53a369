"""Saving and resuming a process: what a checkpoint holds, the LoRA files beside it,
and pruning only after the new save is published.

A save writes the checkpoint (aitk.run.checkpoint: adapter, optimizer, RNG, data
position, LR schedule; published by a rename), then the user-facing LoRA file(s) at
upstream's names (aitk.run.output), then prunes the oldest of both. A resume takes the
newest checkpoint that validates and restores every piece of it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import torch

import aitk
from aitk.config.loading import LoadedConfig
from aitk.config.schema import ProcessConfig
from aitk.data.batches import BatchSource
from aitk.errors import AdapterError, CheckpointError
from aitk.run import checkpoint as ckpt
from aitk.run import distributed, provenance
from aitk.run.assembly import Trainable
from aitk.run.metrics import Metrics
from aitk.run.optim import Schedule, lr_at
from aitk.run.output import step_lora_name, step_lora_step
from aitk.run.ownership import lora_is_ours
from aitk.run.status import StatusFile
from aitk_common.files import check_free_space

SAVE_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


class Saver:
    """Saves one step on rank 0: the checkpoint, then the LoRA file(s), then prunes."""

    def __init__(self, loaded: LoadedConfig, proc: ProcessConfig, out_dir: Path,
                 trainable: Trainable, suffixes: Sequence[str], metrics: Metrics,
                 status: StatusFile) -> None:
        self.loaded, self.proc, self.out_dir = loaded, proc, out_dir
        self.trainable, self.suffixes = trainable, suffixes
        self.metrics, self.status = metrics, status
        self.ckpt_root = out_dir / "checkpoints"
        self.dtype = SAVE_DTYPES[proc.save.dtype]

    def lora_path(self, step: int) -> Path:
        name = self.loaded.name
        return self.out_dir / (f"{name}.safetensors" if step >= self.proc.train.steps
                               else step_lora_name(name, step))

    def save(self, step: int) -> None:
        t, keep = self.trainable, self.proc.save.max_step_saves_to_keep
        self.status.phase("saving")
        meta = lora_metadata(self.loaded, self.proc, step, t.data.epoch)
        files = checkpoint_files(t.network, t.optimizer, t.data, step, t.schedule,
                                 self.loaded, t.extra_state())
        # The checkpoint, then the LoRA (at most the adapter's full-precision size).
        check_free_space(self.out_dir, sum(map(len, files.values()))
                         + len(files["adapter.safetensors"]))
        ckpt.save_checkpoint(self.ckpt_root, step, files)
        lora = self.lora_path(step)
        with t.published():  # the EMA's weights when it is on
            t.network.save_file(lora, meta, dtype=self.dtype)  # atomic, public keys
        ckpt.prune(self.ckpt_root, keep)
        prune_step_loras(self.out_dir, self.loaded.name, keep, self.suffixes)
        names = ", ".join(p.name for p in t.network.file_paths(lora))
        self.metrics.message(f"saved {names} and checkpoint {ckpt.dir_name(step)}")
        self.status.phase("training")

    def repair(self, start: int) -> None:
        """A save cut between its checkpoint and its LoRA file (second Ctrl+C, crash):
        the checkpoint holds the same weights, and the loop will not save this step."""
        network, lora = self.trainable.network, self.lora_path(start)
        if start == 0 or all(p.exists() for p in network.file_paths(lora)):
            return
        with self.trainable.published():
            network.save_file(lora, lora_metadata(self.loaded, self.proc, start,
                                                   self.trainable.data.epoch),
                              dtype=self.dtype)
        self.metrics.message(f"wrote {lora.name} (missing after an interrupted save)")


def resume(ckpt_root: Path, trainable: Trainable, world: distributed.World,
           say: Callable[[str], None], stream: TextIO, name: str) -> int:
    """The step to start from: the newest valid checkpoint restored, or 0. Rank 0 cleans
    up and sets invalid checkpoints aside first; then every rank reads."""
    found = None
    if world.is_main:
        ckpt.clean_stale(ckpt_root)
        found = resume_point(ckpt_root, say)
    distributed.barrier(world)
    if not world.is_main:
        found = resume_point(ckpt_root, say)
    if found is None:
        return 0
    restore(found, trainable.network, trainable.optimizer, trainable.data)
    trainable.load_extra_state(lambda name: torch.load(io.BytesIO(found.read(name)),
                                                       weights_only=True)
                               if (found.path / name).is_file() else None, say)
    print(f"resuming {name} from step {found.step} ({found.path})", file=stream, flush=True)
    return found.step


def resume_point(ckpt_root: Path, say: Callable[[str], None]) -> ckpt.Checkpoint | None:
    """The newest valid checkpoint; None for a fresh start. When checkpoints exist but
    none validates, stop (exit 2) rather than start again from 0 and prune them all."""
    # CorruptCheckpoint (exit 2) when a bad checkpoint cannot be set aside
    found = ckpt.find_resumable(ckpt_root, report=say)
    aside = ckpt.set_aside_earlier(ckpt_root)
    if found is None and aside:
        raise CheckpointError(
            f"no checkpoint in {ckpt_root} validates; set aside (renamed, not deleted): "
            f"{', '.join(p.name for p in aside)}. To start again from step 0, move or "
            f"delete those folders; to keep training them, restore a good copy as step_...")
    return found


def lora_metadata(loaded: LoadedConfig, proc: ProcessConfig, step: int,
                  epoch: int) -> dict[str, str]:
    return {
        "format": "pt",
        "name": loaded.name,
        "software": json.dumps({"name": aitk.SOFTWARE_NAME, "version": aitk.__version__}),
        "training_info": json.dumps({"step": step, "epoch": epoch}),
        "base_model_arch": proc.model.arch,
        "base_model": proc.model.name_or_path,
        "network": json.dumps({"type": proc.network.type, "rank": proc.network.dim,
                               "alpha": proc.network.scale_alpha}),
        "config": json.dumps(loaded.recorded),
        "aitk_info": json.dumps(provenance.collect()),  # same block as `manager info`
    }


def prune_step_loras(out_dir: Path, name: str, keep: int,
                     suffixes: Sequence[str] = ("",)) -> None:
    """Keep the step LoRAs of the newest `keep` steps (every file of a step, one per
    suffix); only files aitk wrote count or are deleted."""
    found = {p: step_lora_step(p, name, suffixes) for p in out_dir.iterdir()}
    found = {p: step for p, step in found.items() if step is not None
             and not p.is_symlink() and lora_is_ours(p)}
    old_steps = sorted(set(found.values()))[:-keep]
    for path, step in found.items():
        if step in old_steps:
            path.unlink(missing_ok=True)


def checkpoint_files(network: Any, optimizer: torch.optim.Optimizer, data: BatchSource,
                     step: int, schedule: Schedule, loaded: LoadedConfig,
                     extra: dict[str, Any] | None = None) -> dict[str, bytes]:
    from safetensors.torch import save

    def torch_bytes(obj: Any) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    adapter = {k: v.detach().to("cpu").contiguous() for k, v in network.state_dict().items()}
    state = {"step": step, "epoch": data.epoch, "data": data.state_dict(),
             "lr": lr_at(step, schedule), "schedule": asdict(schedule),
             "name": loaded.name, "software": aitk.__version__}
    return {"adapter.safetensors": save(adapter), "optimizer.pt": torch_bytes(
        optimizer.state_dict()), "rng.pt": torch_bytes(ckpt.capture_rng()),
        "state.json": json.dumps(state, indent=2).encode(),
        **{name: torch_bytes(obj) for name, obj in (extra or {}).items()}}


def restore(found: ckpt.Checkpoint, network: Any, optimizer: torch.optim.Optimizer,
            data: BatchSource) -> None:
    from safetensors.torch import load


    try:
        network.load_state_dict(load(found.read("adapter.safetensors")))
    except AdapterError as exc:
        raise CheckpointError(
            f"checkpoint {found.path} was trained with another network config ({exc}); "
            "change `config.name` or `training_folder` to start a new run") from None
    optimizer.load_state_dict(torch.load(io.BytesIO(found.read("optimizer.pt")),
                                         weights_only=True))
    data.load_state_dict(found.state()["data"])
    # Last, after everything that draws random numbers while being built.
    ckpt.restore_rng(torch.load(io.BytesIO(found.read("rng.pt")), weights_only=True))
