"""A full fine-tune: a training process without `network` trains the model's own weights,
through the same loop, checkpoints and resume as a LoRA.

What trains: the denoiser part(s) the arch names (BaseModel.denoiser_parts; with
`train.train_unet`), filtered by `model.only_if_contains` / `ignore_if_contains`
(matched against `<part>.<parameter name>`, e.g. `transformer.transformer_blocks.0...`,
as upstream matches), and with `train.train_text_encoder` the text encoders the arch
can train (BaseModel.text_encoder_parts). Those parameters are unfrozen in the dtype
they were loaded in (`train.dtype`), with gradient checkpointing as configured; the
optimizer is the one `train.optimizer` names (aitk.run.optim). `FullWeights.params` is
the one list the loop, the optimizer, the gradient averaging and the checkpoint read,
so anything that works on "the trained parameters" (EMA, clipping) applies here too.

Checkpoints hold the trained parameters as they are in memory, sharded
(`weights*.safetensors`, aitk.run.checkpoint), with the optimizer state: resume is exact.
The outputs (`ModelOutputs`) are the whole model each save, as upstream names them:
`NAME_000000250/` and the final `NAME/` (save_format diffusers: a diffusers folder) or
`NAME_000000250.safetensors` / `NAME.safetensors` (one file of the denoiser), written
by aitk.run.model_files in `save.dtype`.

Memory: beyond a LoRA run's, the trained parameters' gradients (their dtype) and the
optimizer's state for them (AdamW: two tensors per parameter), and no quantized
denoiser (the preflight refuses `model.quantize`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import aitk
from aitk.config.loading import LoadedConfig
from aitk.config.schema import TrainingProcess
from aitk.errors import CheckpointError, ModelError
from aitk.run import checkpoint as ckpt
from aitk.run import provenance
from aitk.run.output import step_lora_name, step_lora_step

WEIGHTS_PATTERN = "weights{suffix}.safetensors"
MAX_CHECKPOINT_SHARD = "5GB"


def selected(name: str, only: Sequence[str] | None, ignore: Sequence[str] | None) -> bool:
    """Upstream's rule: any `only` pattern in the name (when given), no `ignore` one."""
    if only and not any(p in name for p in only):
        return False
    return not (ignore and any(p in name for p in ignore))


class FullWeights:
    """The model parameters a full fine-tune trains, by name (`<part>.<parameter>`)."""

    def __init__(self, model: Any, proc: TrainingProcess) -> None:
        tr, cfg = proc.train, proc.model
        parts: dict[str, nn.Module] = {}
        self.encoders: set[str] = set()  # the parts that are text encoders
        if tr.train_unet:
            parts.update(model.denoiser_parts())
        if tr.train_text_encoder:
            encoders = model.text_encoder_parts()
            if not encoders:
                raise ModelError(f"train.train_text_encoder: the {model.arch} arch does "
                                 "not train its text encoder here; set it false")
            if getattr(cfg, "quantize_te", False):
                raise ModelError("train.train_text_encoder: a quantized text encoder "
                                 "cannot train; set model.quantize_te: false")
            parts.update(encoders)
            self.encoders = set(encoders)
            model.train_text_encoders()  # prompts embedded with gradients from now on
        self.parts = parts
        self.named: dict[str, nn.Parameter] = {}
        for part, module in parts.items():
            for name, param in module.named_parameters():
                full = f"{part}.{name}"
                if param.is_floating_point() and selected(full, cfg.only_if_contains,
                                                          cfg.ignore_if_contains):
                    self.named[full] = param
        if not self.named:
            raise ModelError(f"model.only_if_contains {cfg.only_if_contains} / "
                             f"ignore_if_contains {cfg.ignore_if_contains} leave no "
                             "parameter to train")
        for param in self.named.values():
            param.requires_grad_(True)

    @property
    def params(self) -> list[nn.Parameter]:
        return list(self.named.values())

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.params

    def modules(self) -> list[nn.Module]:
        return list(self.parts.values())

    def trained_parts(self) -> list[nn.Module]:
        """The modules that train (the loop's train/eval switch), as an adapter's."""
        return self.modules()

    def text_encoder_parameters(self) -> list[nn.Parameter]:
        """The text encoders' trained weights: the optimizer gives them
        `text_encoder_lr` (aitk.run.assembly.parameter_groups)."""
        return [p for name, p in self.named.items() if name.split(".", 1)[0] in self.encoders]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.named.items()}

    # ---- checkpoint ----------------------------------------------------------------
    def checkpoint_files(self) -> dict[str, ckpt.Content]:
        """The trained parameters as shards (one writer each) and their index."""
        from huggingface_hub import split_torch_state_dict_into_shards
        from safetensors.torch import save_file

        state = {k: v.to("cpu").contiguous() for k, v in self.state_dict().items()}
        split = split_torch_state_dict_into_shards(
            state, filename_pattern=WEIGHTS_PATTERN, max_shard_size=MAX_CHECKPOINT_SHARD)
        files: dict[str, ckpt.Content] = {}
        for filename, names in split.filename_to_tensors.items():
            def write(path: Path, names: list[str] = names) -> None:
                save_file({n: state[n] for n in names}, str(path), metadata={"format": "pt"})

            files[filename] = write
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            files[WEIGHTS_PATTERN.format(suffix="") + ".index.json"] = \
                json.dumps(index, indent=2).encode()
        return files

    def restore(self, found: ckpt.Checkpoint) -> None:
        """Copy the checkpoint's tensors into the parameters, one at a time."""
        from safetensors import safe_open

        single = WEIGHTS_PATTERN.format(suffix="")
        if found.has(single + ".index.json"):
            index = json.loads(found.read(single + ".index.json"))
            shards = sorted(set(index["weight_map"].values()))
        else:
            shards = [single]
        seen: set[str] = set()
        for shard in shards:
            with safe_open(str(found.file(shard)), framework="pt", device="cpu") as fh:
                for name in fh.keys():
                    param = self.named.get(name)
                    tensor = fh.get_tensor(name)
                    if param is None or tuple(param.shape) != tuple(tensor.shape):
                        raise CheckpointError(
                            f"checkpoint {found.path} trained other weights ({name}); "
                            "change `config.name` or `training_folder` to start a new run")
                    with torch.no_grad():
                        param.copy_(tensor.to(param.device, param.dtype))
                    seen.add(name)
        missing = sorted(set(self.named) - seen)
        if missing:
            raise CheckpointError(f"checkpoint {found.path} lacks {len(missing)} trained "
                                f"weights (e.g. {missing[0]}); change `config.name` or "
                                "`training_folder` to start a new run")

    def size(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.named.values())


class ModelOutputs:
    """A full fine-tune's outputs beside its checkpoints (aitk.run.saving.Outputs)."""

    def __init__(self, loaded: LoadedConfig, proc: TrainingProcess, out_dir: Path,
                 model: Any, weights: FullWeights) -> None:
        from aitk.run.saving import SAVE_DTYPES

        self.loaded, self.proc, self.out_dir = loaded, proc, out_dir
        self.model, self.weights_ = model, weights
        self.dtype = SAVE_DTYPES[proc.save.dtype]
        self.folder = proc.save.save_format == "diffusers"

    def path(self, step: int) -> Path:
        name = self.loaded.name
        file = (f"{name}.safetensors" if step >= self.proc.train.steps
                else step_lora_name(name, step))
        return self.out_dir / (file[: -len(".safetensors")] if self.folder else file)

    def _parts(self) -> dict[str, nn.Module]:
        # The whole denoiser (every part, trained or not) and any trained text encoder.
        parts = dict(self.model.denoiser_parts())
        parts.update({k: v for k, v in self.weights_.parts.items() if k not in parts})
        return parts

    def paths(self, path: Path) -> list[Path]:
        if self.folder:
            return [path]
        from aitk.run.model_files import single_file_paths

        return list(single_file_paths(path, self.model.denoiser_parts()).values())

    def record(self, step: int, epoch: int) -> dict[str, Any]:
        software = json.dumps({"name": aitk.SOFTWARE_NAME, "version": aitk.__version__})
        return {"name": self.loaded.name, "software": software,
                "training_info": json.dumps({"step": step, "epoch": epoch}),
                "base_model_arch": self.proc.model.arch,
                "base_model": self.proc.model.name_or_path,
                "config": json.dumps(self.loaded.recorded),
                "aitk_info": json.dumps(provenance.collect())}

    def write(self, path: Path, step: int, epoch: int) -> None:
        from aitk.run.model_files import write_diffusers, write_single_files

        if self.folder:
            write_diffusers(path, self._parts(), self.proc.model.name_or_path, self.dtype,
                            self.record(step, epoch))
        else:
            write_single_files(path, self.model.denoiser_parts(), self.dtype,
                               self.record(step, epoch))

    def prune(self, keep: int) -> None:
        prune_step_models(self.out_dir, self.loaded.name, keep)

    def weights(self) -> dict[str, ckpt.Content]:
        return self.weights_.checkpoint_files()

    def restore(self, found: ckpt.Checkpoint) -> None:
        self.weights_.restore(found)

    def size(self) -> int:
        # The checkpoint's weights and optimizer state (AdamW: twice the weights), the
        # output in its save dtype.
        params = sum(p.numel() for p in self._parts_params())
        return 3 * self.weights_.size() + params * torch.finfo(self.dtype).bits // 8

    def _parts_params(self) -> list[nn.Parameter]:
        return [p for m in self._parts().values() for p in m.parameters()]


def prune_step_models(out_dir: Path, name: str, keep: int) -> None:
    """Keep the newest `keep` step outputs (folders or files); only what aitk wrote counts
    or is removed (aitk.run.model_files.remove_model_output checks)."""
    from aitk.run.model_files import remove_model_output
    from aitk.run.ownership import lora_is_ours, model_folder_is_ours

    steps: dict[Path, int] = {}
    for entry in out_dir.iterdir():
        if entry.is_symlink():
            continue
        probe = entry if entry.is_file() else entry.with_name(entry.name + ".safetensors")
        step = step_lora_step(probe, name)
        if step is None:
            continue
        if (entry.is_dir() and model_folder_is_ours(entry)) or \
                (entry.is_file() and lora_is_ours(entry)):
            steps[entry] = step
    old = sorted(set(steps.values()))[:-keep]
    for entry, step in steps.items():
        if step in old:
            remove_model_output(entry)


def attach_full(proc: TrainingProcess, model: Any, items: Sequence[Any],
                latents: Callable[..., torch.Tensor] | None, embeds: Callable[..., Any],
                control_embeds: Any, vary_captions: bool = True,
                audio: Callable[..., Any] | None = None) -> Any:
    """The model's own weights unfrozen, gradient checkpointing on each trained part, the
    optimizer over them: an aitk.run.assembly.Trainable like an adapter's."""
    from aitk.run.assembly import enable_gradient_checkpointing, trainable_over

    weights = FullWeights(model, proc)
    modules = weights.modules()
    if proc.train.gradient_checkpointing:
        for module in modules:
            enable_gradient_checkpointing(module)
    return trainable_over(proc, model, weights, nn.ModuleList(modules), weights.params,
                          items, latents, embeds, control_embeds, vary_captions, audio)
