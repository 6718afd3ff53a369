"""`job: extract`: a LoRA (LoCon) from the difference of a fine-tuned model and its base,
in the arch's LoRA layout, layer by layer.

Neither model is built: the denoiser's weights are read from their safetensors files one
tensor at a time (`WeightFiles`, safetensors' `safe_open`), so the peak is about two
layers and one SVD, not two models. For each layer the arch would train
(`BaseModel.extraction_targets`: its Linear layers, and Conv layers for `locon`), the
difference is factorised by SVD (aitk.adapters.svd, upstream's modes) into down/up with
alpha = rank; unchanged layers are skipped. The factors, under the layers' own names,
go through the arch's key conversion (`convert_lora_weights_before_save`) and file split
(`split_lora_file`), exactly as a trained LoRA does, so the file loads wherever the
arch's LoRAs load. Each model is a diffusers folder (its denoiser subfolder(s)), the
denoiser's own folder, one safetensors file of the denoiser in diffusers names (a full
fine-tune's `save_format: safetensors`), or a hub id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO

import torch

from aitk.config.extract import ExtractJob, ExtractProcess
from aitk.config.loading import LoadedConfig
from aitk.config.schema import ModelConfig
from aitk.errors import ModelError
from aitk.jobs.records import claim, output_metadata
from aitk.run import distributed
from aitk.run.saving import SAVE_DTYPES
from aitk.run.signals import StopFlag
from aitk.run.status import StatusFile
from aitk.run.train import Outcome

WEIGHT_FILES = ("diffusion_pytorch_model.safetensors",
                "diffusion_pytorch_model.safetensors.index.json")


def _part_files(folder: Path) -> list[Path]:
    """A part folder's safetensors files (all shards the index names)."""
    single, index = (folder / name for name in WEIGHT_FILES)
    if index.is_file():
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{index} is not a readable shard index ({exc})") from None
        return [folder / n for n in sorted(names)]
    if single.is_file():
        return [single]
    raise ModelError(f"{folder} holds no diffusion_pytorch_model*.safetensors (aitk "
                        "reads safetensors weights only)")


def locate(location: str, subfolders: tuple[str, ...]) -> dict[str, list[Path]]:
    """part -> its weight files: from a diffusers folder, a denoiser folder, one
    safetensors file (one part only) or a hub id (downloaded as the hub client does,
    HF_HUB_OFFLINE and HF_HOME honoured)."""
    path = Path(location).expanduser()
    if path.is_file():
        if len(subfolders) > 1:
            raise ModelError(f"{location} is one file, but this arch's denoiser has "
                                f"{len(subfolders)} parts ({', '.join(subfolders)}); point "
                                "at the diffusers folder")
        return {subfolders[0]: [path]}
    if not path.exists():
        path = _download(location, subfolders)
    if all((path / sub).is_dir() for sub in subfolders):
        return {sub: _part_files(path / sub) for sub in subfolders}
    if len(subfolders) == 1 and (path / "config.json").is_file():
        return {subfolders[0]: _part_files(path)}  # the denoiser's own folder
    raise ModelError(f"{location} has no {'/ '.join(subfolders)}/ folder with the "
                        "denoiser's weights (expected a diffusers model folder)")


def _download(repo: str, subfolders: tuple[str, ...]) -> Path:
    from huggingface_hub import snapshot_download

    from aitk.models.loading import HUB_FIX

    try:
        return Path(snapshot_download(repo, allow_patterns=[f"{s}/*" for s in subfolders]))
    except Exception as exc:  # offline, gated, unknown: one line
        detail = " ".join(str(exc).split())[:200]
        raise ModelError(f"model {repo} is not a folder or file here and the hub did "
                            f"not give it ({detail}); {HUB_FIX}") from None


class WeightFiles:
    """One model's denoiser weights by name (`<part>.` prefixed when it has several
    parts, as get_model_to_train() names them), each read only when asked for."""

    def __init__(self, files: dict[str, list[Path]], stack: ExitStack) -> None:
        from safetensors import safe_open

        self._where: dict[str, tuple[Any, str]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        prefixed = len(files) > 1
        for part, paths in files.items():
            for path in paths:
                try:
                    handle = stack.enter_context(safe_open(str(path), framework="pt",
                                                           device="cpu"))
                except Exception as exc:  # safetensors raises several types
                    raise ModelError(f"{path} is not a readable safetensors file "
                                        f"({exc})") from None
                for key in handle.keys():
                    name = f"{part}.{key}" if prefixed else key
                    self._where[name] = (handle, key)
                    self.shapes[name] = tuple(handle.get_slice(key).get_shape())

    def get(self, name: str) -> torch.Tensor:
        handle, key = self._where[name]
        return handle.get_tensor(key)


@contextmanager
def opened(location: str, subfolders: tuple[str, ...]) -> Iterator[WeightFiles]:
    with ExitStack() as stack:
        yield WeightFiles(locate(location, subfolders), stack)


def unloaded_model(job: ExtractJob) -> Any:
    """An instance of the arch (no weights): its layout hooks are all extraction needs."""
    from aitk.models import registry

    cfg = job.config
    settings = ModelConfig(name_or_path=cfg.base_model, arch=cfg.arch or "")
    return registry.get_model_class(settings.arch)(settings)


def run_process(loaded: LoadedConfig, proc: ExtractProcess, stop: StopFlag, stream: TextIO,
                world: distributed.World, status: StatusFile) -> Outcome:
    from aitk.adapters.keys import ALPHA_SUFFIX
    from aitk.adapters.network import part_path
    from aitk.adapters.svd import factorize
    from aitk_common.files import atomic_write_bytes

    job: ExtractJob = loaded.job  # type: ignore[assignment]
    cfg = job.config
    index = next(i for i, p in enumerate(cfg.process) if p is proc)
    target = job.targets()[index]
    device = torch.device(cfg.device)
    model = unloaded_model(job)
    subfolders = tuple(model.denoiser_subfolders)
    status.phase("loading", message="reading the models' weight files")
    sd: dict[str, torch.Tensor] = {}
    ranks, errors, unchanged = [], [], 0
    with opened(cfg.base_model, subfolders) as base, \
            opened(cfg.extract_model, subfolders) as tuned:
        layers = model.extraction_targets(tuned.shapes, conv=proc.type == "locon")
        missing = [t for t in layers if f"{t}.weight" not in base.shapes]
        if missing:
            raise ModelError(f"{cfg.base_model} lacks {len(missing)} layers of "
                                f"{cfg.extract_model} (e.g. {missing[0]}): are they the "
                                "same model?")
        if not layers:
            raise ModelError(f"{cfg.extract_model} has no layer a {model.arch} LoRA "
                                "trains (are its weights in diffusers names?)")
        for i, layer in enumerate(layers):
            stop.check()
            status.phase("working", step=i, total_steps=len(layers),
                         message=f"extracting {layer}")
            name = f"{layer}.weight"
            if base.shapes[name] != tuned.shapes[name]:
                raise ModelError(f"{layer}: shapes differ ({base.shapes[name]} vs "
                                    f"{tuned.shapes[name]}): are they the same model?")
            param = proc.conv if len(tuned.shapes[name]) == 4 else proc.linear
            if not param and proc.mode == "fixed":
                continue  # rank 0 for this kind of layer: not extracted
            delta = tuned.get(name).to(device, torch.float32) - \
                base.get(name).to(device, torch.float32)
            if not torch.any(delta):
                unchanged += 1
                continue
            factors = factorize(delta, proc.mode, float(param))
            sd[f"{layer}.lora_A.weight"] = factors.down.cpu()
            sd[f"{layer}.lora_B.weight"] = factors.up.cpu()
            sd[f"{layer}{ALPHA_SUFFIX}"] = torch.tensor(float(factors.rank))
            ranks.append(factors.rank)
            errors.append(factors.error)
    if not ranks:
        raise ModelError(f"{cfg.extract_model} and {cfg.base_model} do not differ in "
                            "any layer a LoRA trains: nothing to extract")
    status.phase("saving")
    dtype = SAVE_DTYPES[proc.dtype or cfg.dtype]
    weights = {k: v if k.endswith(ALPHA_SUFFIX) else v.to(dtype).contiguous()
               for k, v in sd.items()}
    made = {"base_model": cfg.base_model, "extract_model": cfg.extract_model,
            "type": proc.type, "mode": proc.mode, "linear": proc.linear, "conv": proc.conv,
            "layers": len(ranks), "unchanged_layers": unchanged, "max_rank": max(ranks),
            "max_error": max(errors), "mean_error": sum(errors) / len(errors)}
    meta = output_metadata(loaded, made, job.meta)
    meta.update({"network_type": "lora", "network_rank": str(max(ranks)),
                 "network_alpha": str(max(ranks)), "base_model_arch": model.arch,
                 "base_model": cfg.base_model, "format": "pt"})
    from safetensors.torch import save

    public = model.convert_lora_weights_before_save(weights)
    files = {part_path(target, s): part for s, part in model.split_lora_file(public).items()}
    for path in files:
        claim(path)
    for path, part in files.items():
        atomic_write_bytes(path, save(part, metadata=meta))
    print(f"wrote {', '.join(str(p) for p in files)}: {len(ranks)} layers, ranks "
          f"{min(ranks)}..{max(ranks)}, relative error max {max(errors):.3g} (mean "
          f"{sum(errors) / len(errors):.3g}); {unchanged} layers unchanged", file=stream,
          flush=True)
    return Outcome.FINISHED
