"""Saving and resuming a process: what a checkpoint holds, the user-facing files beside
it, and pruning only after the new save is published.

A save writes the checkpoint (aitk.run.checkpoint: the trained weights, optimizer, RNG,
data position, LR schedule; published by a rename), then the user-facing output at
upstream's names, then prunes the oldest of both. What is trained decides the output
(an `Outputs`): `LoraOutputs` here (the LoRA file(s) of an adapter), `ModelOutputs` in
aitk.run.finetune (a full fine-tune's model folder or file). A resume takes the newest
checkpoint that validates and restores every piece of it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch

import aitk
from aitk.config.loading import LoadedConfig
from aitk.config.schema import TrainingProcess
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


class Outputs(Protocol):
    """What a save writes beside the checkpoint, and the weights the checkpoint holds."""

    def path(self, step: int) -> Path: ...  # the output of a step (the final one at the end)

    def paths(self, path: Path) -> list[Path]: ...  # every file/folder `write(path)` makes

    def write(self, path: Path, step: int, epoch: int) -> None: ...

    def prune(self, keep: int) -> None: ...  # the newest `keep` step outputs stay

    def weights(self) -> dict[str, ckpt.Content]: ...  # the checkpoint's weight files

    def restore(self, found: ckpt.Checkpoint) -> None: ...

    def size(self) -> int: ...  # bytes a save needs, about (for the free-space check)


class LoraOutputs:
    """An adapter's outputs: `NAME.safetensors` / `NAME_000000250.safetensors` (one per
    `lora_file_suffixes()` entry) in the arch's public layout; its checkpoint weights are
    the adapter in internal names, full precision."""

    def __init__(self, loaded: LoadedConfig, proc: TrainingProcess, out_dir: Path,
                 network: Any, suffixes: Sequence[str]) -> None:
        self.loaded, self.proc, self.out_dir = loaded, proc, out_dir
        self.network, self.suffixes = network, suffixes
        self.dtype = SAVE_DTYPES[proc.save.dtype]

    def path(self, step: int) -> Path:
        name = self.loaded.name
        return self.out_dir / (f"{name}.safetensors" if step >= self.proc.train.steps
                               else step_lora_name(name, step))

    def paths(self, path: Path) -> list[Path]:
        return self.network.file_paths(path)

    def write(self, path: Path, step: int, epoch: int) -> None:
        meta = lora_metadata(self.loaded, self.proc, step, epoch)
        self.network.save_file(path, meta, dtype=self.dtype)  # atomic, public keys

    def prune(self, keep: int) -> None:
        prune_step_loras(self.out_dir, self.loaded.name, keep, self.suffixes)

    def weights(self) -> dict[str, ckpt.Content]:
        from safetensors.torch import save

        adapter = {k: v.detach().to("cpu").contiguous()
                   for k, v in self.network.state_dict().items()}
        return {"adapter.safetensors": save(adapter)}

    def restore(self, found: ckpt.Checkpoint) -> None:
        from safetensors.torch import load

        try:
            self.network.load_state_dict(load(found.read("adapter.safetensors")))
        except AdapterError as exc:
            raise CheckpointError(
                f"checkpoint {found.path} was trained with another network config ({exc}); "
                "change `config.name` or `training_folder` to start a new run") from None

    def size(self) -> int:
        # the checkpoint's adapter, the LoRA file (at most that size) and the optimizer
        return 4 * sum(p.numel() * p.element_size()
                       for p in self.network.trainable_parameters())


class Saver:
    """Saves one step on rank 0: the checkpoint, then the outputs, then prunes."""

    def __init__(self, loaded: LoadedConfig, proc: TrainingProcess, out_dir: Path,
                 trainable: Trainable, outputs: Outputs, metrics: Metrics,
                 status: StatusFile) -> None:
        self.loaded, self.proc, self.out_dir = loaded, proc, out_dir
        self.trainable, self.outputs = trainable, outputs
        self.metrics, self.status = metrics, status
        self.ckpt_root = out_dir / "checkpoints"

    def save(self, step: int) -> None:
        t, keep = self.trainable, self.proc.save.max_step_saves_to_keep
        self.status.phase("saving")
        files = checkpoint_files(self.outputs, t.optimizer, t.data, step, t.schedule,
                                 self.loaded, t.extra_state())
        check_free_space(self.out_dir, self.outputs.size())
        ckpt.save_checkpoint(self.ckpt_root, step, files, self.outputs.size())
        path = self.outputs.path(step)
        with t.published():  # the EMA's weights when it is on
            self.outputs.write(path, step, t.data.epoch)
        ckpt.prune(self.ckpt_root, keep)
        self.outputs.prune(keep)
        names = ", ".join(p.name for p in self.outputs.paths(path))
        self.metrics.message(f"saved {names} and checkpoint {ckpt.dir_name(step)}")
        self.status.phase("training")

    def repair(self, start: int) -> None:
        """A save cut between its checkpoint and its output (second Ctrl+C, crash): the
        checkpoint holds the same weights, and the loop will not save this step."""
        path = self.outputs.path(start)
        if start == 0 or all(p.exists() for p in self.outputs.paths(path)):
            return
        with self.trainable.published():
            self.outputs.write(path, start, self.trainable.data.epoch)
        self.metrics.message(f"wrote {path.name} (missing after an interrupted save)")


def resume(ckpt_root: Path, trainable: Trainable, outputs: Outputs,
           world: distributed.World, say: Callable[[str], None], stream: TextIO,
           name: str) -> int:
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
    restore(found, outputs, trainable.optimizer, trainable.data)
    trainable.load_extra_state(lambda name: torch.load(found.file(name), weights_only=True)
                               if found.has(name) else None, say)
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


def lora_metadata(loaded: LoadedConfig, proc: TrainingProcess, step: int,
                  epoch: int) -> dict[str, str]:
    network = proc.network
    return {
        "format": "pt",
        "name": loaded.name,
        "software": json.dumps({"name": aitk.SOFTWARE_NAME, "version": aitk.__version__}),
        "training_info": json.dumps({"step": step, "epoch": epoch}),
        "base_model_arch": proc.model.arch,
        "base_model": proc.model.name_or_path,
        "network": json.dumps(None if network is None else {
            "type": network.type, "rank": network.dim, "alpha": network.scale_alpha}),
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


def checkpoint_files(outputs: Outputs, optimizer: torch.optim.Optimizer,
                     data: BatchSource, step: int, schedule: Schedule,
                     loaded: LoadedConfig, extra: dict[str, Any] | None = None
                     ) -> dict[str, ckpt.Content]:
    """The checkpoint's files; `extra`: name -> object for torch.save (the EMA)."""
    def torch_bytes(obj: Any) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    state = {"step": step, "epoch": data.epoch, "data": data.state_dict(),
             "lr": lr_at(step, schedule), "schedule": asdict(schedule),
             "name": loaded.name, "software": aitk.__version__}
    def writer(obj: Any) -> ckpt.Content:
        return lambda path: torch.save(obj, path)

    # The optimizer state (and an EMA) is written straight to its file: a full
    # fine-tune's is twice the model, too large to hold again as bytes.
    return {**outputs.weights(),
            "optimizer.pt": lambda path: torch.save(optimizer.state_dict(), path),
            "rng.pt": torch_bytes(ckpt.capture_rng()),
            "state.json": json.dumps(state, indent=2).encode(),
            **{name: writer(obj) for name, obj in (extra or {}).items()}}


def restore(found: ckpt.Checkpoint, outputs: Outputs, optimizer: torch.optim.Optimizer,
            data: BatchSource) -> None:
    outputs.restore(found)
    optimizer.load_state_dict(torch.load(found.file("optimizer.pt"), weights_only=True))
    data.load_state_dict(found.state()["data"])
    # Last, after everything that draws random numbers while being built.
    ckpt.restore_rng(torch.load(io.BytesIO(found.read("rng.pt")), weights_only=True))
