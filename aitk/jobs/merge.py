"""`job: mod` (rescale_lora) and `job: merge` (merge_loras, merge_into_model): LoRA
arithmetic on files (aitk.adapters.lora_files), the output in the inputs' own layout; a
merge into a model loads the model, adds each LoRA's weighted delta to its weights
(aitk.adapters.hooks.merge_into_weights) and saves it as a full model
(aitk.run.model_files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from aitk.adapters.lora_files import LoraFile, merged, rescaled
from aitk.config.loading import LoadedConfig
from aitk.config.mod import MergeIntoModelProcess, MergeLorasProcess, RescaleProcess
from aitk.jobs.records import claim, job_meta, output_metadata
from aitk.run import distributed
from aitk.run.saving import SAVE_DTYPES
from aitk.run.signals import StopFlag
from aitk.run.status import StatusFile
from aitk.run.train import Outcome


def _say(stream: TextIO, message: str) -> None:
    print(message, file=stream, flush=True)


def run_rescale(loaded: LoadedConfig, proc: RescaleProcess, stop: StopFlag, stream: TextIO,
                world: distributed.World, status: StatusFile) -> Outcome:
    source, target = Path(proc.input_path).expanduser(), Path(proc.output_path).expanduser()
    status.phase("working", message=f"rescaling {source.name}")
    lora = LoraFile.read(source)
    out = rescaled(lora, proc.scale, proc.scale_target)
    base = job_meta(loaded) if proc.replace_meta else lora.metadata
    meta = output_metadata(loaded, {"rescaled": str(source), "scale": proc.scale,
                                    "current_weight": proc.current_weight,
                                    "target_weight": proc.target_weight,
                                    "scale_target": proc.scale_target}, base)
    stop.check()
    claim(target, replaces=[source])
    out.write(target, meta, SAVE_DTYPES[proc.save_dtype])
    _say(stream, f"wrote {target}: {source.name} at weight {proc.target_weight:g} now does "
         f"what it did at {proc.current_weight:g} (scale {proc.scale:g})")
    return Outcome.FINISHED


def run_process(loaded: LoadedConfig, proc: Any, stop: StopFlag, stream: TextIO,
                world: distributed.World, status: StatusFile) -> Outcome:
    if isinstance(proc, MergeLorasProcess):
        return merge_loras(loaded, proc, stop, stream, status)
    assert isinstance(proc, MergeIntoModelProcess)
    return merge_into_model(loaded, proc, stop, stream, status)


def merge_loras(loaded: LoadedConfig, proc: MergeLorasProcess, stop: StopFlag,
                stream: TextIO, status: StatusFile) -> Outcome:
    target = Path(proc.output_path).expanduser()
    inputs = []
    for i, ref in enumerate(proc.loras):
        status.phase("working", step=i, total_steps=len(proc.loras),
                     message=f"reading {Path(ref.path).name}")
        inputs.append((LoraFile.read(Path(ref.path).expanduser()), ref.weight))
        stop.check()
    status.phase("working", message="merging")
    result, report = merged(inputs, proc.rank)
    how = ("exact (ranks side by side)" if proc.rank is None else
           f"SVD to rank {proc.rank}: relative error max {report.max_error:.3g}, mean "
           f"{report.mean_error:.3g}")
    meta = output_metadata(loaded, {
        "merged": [{"path": r.path, "weight": r.weight} for r in proc.loras],
        "rank": report.rank, "method": "exact" if proc.rank is None else "svd",
        "max_error": report.max_error, "mean_error": report.mean_error},
        inputs[0][0].metadata)
    stop.check()
    claim(target)
    result.write(target, meta, SAVE_DTYPES[proc.save_dtype])
    _say(stream, f"wrote {target}: {len(inputs)} LoRAs merged, rank {report.rank}, {how}")
    return Outcome.FINISHED


def merge_into_model(loaded: LoadedConfig, proc: MergeIntoModelProcess, stop: StopFlag,
                     stream: TextIO, status: StatusFile) -> Outcome:
    import torch

    from aitk.adapters.hooks import merge_into_weights
    from aitk.jobs.generate import load_for_inference
    from aitk.run.model_files import metadata_strings, write_diffusers, write_single_files

    target = Path(proc.output_path).expanduser()
    device = proc.device or loaded.job.config.device
    status.phase("loading")
    model = load_for_inference(proc.model, device, torch.float32, stream)
    stop.check()
    status.phase("working", message="merging the LoRAs into the weights")
    loras = [(Path(r.path).expanduser(), r.weight) for r in proc.loras]
    changed = merge_into_weights(model, loras)
    stop.check()
    status.phase("saving")
    dtype = SAVE_DTYPES[proc.save_dtype]
    record = output_metadata(loaded, {"merged": [{"path": r.path, "weight": r.weight}
                                                 for r in proc.loras],
                                      "base_model": proc.model.name_or_path})
    claim(target)
    parts = model.denoiser_parts()
    if proc.save_format == "diffusers":
        write_diffusers(target, parts, proc.model.name_or_path, dtype, record)
        written = [target]
    else:
        written = write_single_files(target, parts, dtype, metadata_strings(record))
    _say(stream, f"wrote {', '.join(str(p) for p in written)}: {len(loras)} LoRAs merged "
         f"into {changed} layers of {proc.model.name_or_path}")
    return Outcome.FINISHED
