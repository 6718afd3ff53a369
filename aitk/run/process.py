"""One training process of a job (a `config.process[i]` entry): a LoRA/LoKr run, a full
fine-tune (no `network`) or a slider, as a short sequence of named steps. Each step
lives in the module that owns its concern:

    refuse foreign outputs  output     a file (a full fine-tune's folder) at this run's
                                       output names that aitk did not write stops the
                                       run before anything loads
    join the ranks          distributed  the device, the process group
    load the model          assembly   built first with `create_if_missing`; configured;
                                       then rank 0 claims the folder (output.claim)
    scan the datasets       assembly   items with buckets, repeats and control images
                                       (a slider may have none)
    embed the slider        slider     a slider's prompts, before any text-encoder unload
    encode the inputs       caches     latents and text embeddings, cached or per batch
    attach what trains      assembly   the adapter, or the model's own weights
                            finetune   (full fine-tune); optimizer, LR, batch source, EMA
    resume                  saving     the newest checkpoint that validates
    train                   train      the loop; saving.Saver (with the LoRA or model
                                       outputs) and sampling.Previews are its `save` and
                                       `sample`, objectives (or a slider's) its loss,
                                       validation its held-out loss, data.masks its
                                       batches' loss masks

Under torchrun every rank runs all of it; rank 0 alone writes (outputs, checkpoints,
samples, logs, the status file) and holds the output folder's lock, and the others
train their shard. The jobs that train nothing (extract, mod, merge, generate) have
their runners in aitk.jobs.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from aitk.config.loading import LoadedConfig
from aitk.config.schema import TrainingProcess
from aitk.data.dataset import Item
from aitk.data.masks import MaskRule, Masks
from aitk.errors import ObjectiveError
from aitk.models.description import PartRole
from aitk.run import distributed
from aitk.run.assembly import (
    Reporter,
    Trainable,
    attach_adapter,
    ensure_example_model,
    load_model,
    pick_device,
    quiet_library_progress,
    scan_datasets,
)
from aitk.run.caches import Inputs, encode_inputs
from aitk.run.metrics import Metrics
from aitk.run.objectives import (
    build_objective,
    check_objective,
    extra_captions,
    preservation_rules,
)
from aitk.run.output import claim, output_lock, refuse_foreign_loras, write_run_config
from aitk.run.saving import LoraOutputs, Outputs, Saver, resume
from aitk.run.signals import StopFlag
from aitk.run.status import StatusFile
from aitk.run.trackers import NONE as NO_TRACKERS
from aitk.run.trackers import Trackers, open_trackers
from aitk.run.train import LoopSettings, LossFn, Outcome, Run, train
from aitk_common import requests
from aitk_common.requests import Request


@dataclass
class Process:
    """What every step of one process reads."""

    loaded: LoadedConfig
    proc: TrainingProcess
    out_dir: Path
    stop: StopFlag
    stream: TextIO  # rank 0's console; the other ranks write to a buffer
    world: distributed.World
    status: StatusFile
    say: Reporter  # warnings, each distinct one once

    @property
    def main(self) -> bool:
        return self.world.is_main

    @property
    def name(self) -> str:
        return self.loaded.name


def run_process(loaded: LoadedConfig, proc: TrainingProcess, stop: StopFlag,
                stream: TextIO, world: distributed.World = distributed.SINGLE,
                status: StatusFile | None = None) -> Outcome:
    """One process of a job, holding its output folder's lock on rank 0."""
    out_dir = Path(proc.training_folder).expanduser() / loaded.name
    if not world.is_main:
        stream = io.StringIO()  # one console voice: rank 0's
    p = Process(loaded, proc, out_dir, stop, stream, world, status or StatusFile(None),
                Reporter(stream))
    if not p.main:
        return train_process(p)
    with output_lock(out_dir, loaded.source):
        return train_process(p)


def train_process(p: Process) -> Outcome:
    if p.main:
        refuse_foreign_outputs(p, ("",))
    device = join_ranks(p)
    model = load(p, device)
    offload_layers(p, model, PartRole.TEXT_ENCODER)
    p.stop.check()
    items = scan_datasets(p.proc, model.get_bucket_divisibility(), p.say,
                          getattr(model, "is_video", False), model.audio_format() is not None)
    masks = Masks([MaskRule.of(ds) for ds in p.proc.datasets], items, p.say)
    previews = preview_configs(p, model, items)
    slider_embeds = embed_slider(p, model)
    p.status.phase("caching")
    inputs = encode_inputs(p.proc, model, items, previews, p.stop, p.say, p.stream, p.world,
                           extra_captions(p.proc), held_out_prompts(p))
    trainable, outputs = attach(p, model, items, inputs)
    offload_layers(p, model, PartRole.DENOISER)
    compile_blocks(p, model)
    objective = objective_for(p.proc, model, trainable.network, inputs, slider_embeds)
    start = resume(p.out_dir / "checkpoints", trainable, outputs, p.world, p.say, p.stream,
                   p.name)
    if p.main:
        write_run_config(p.out_dir / "config.yaml", p.loaded, p.say)
    announce(p, items, device)
    return train_from(p, model, trainable, outputs, objective, inputs, previews, start,
                      device, masks)


def writes_folders(proc: TrainingProcess) -> bool:
    """A full fine-tune saved as diffusers folders: its outputs are folders."""
    return proc.full_fine_tune and proc.save.save_format == "diffusers"


def refuse_foreign_outputs(p: Process, suffixes: Sequence[str]) -> None:
    """Stop before anything trains when this run's output names hold someone else's
    files (and, for a full fine-tune saved as folders, folders)."""
    refuse_foreign_loras(p.out_dir, p.name, suffixes, folders=writes_folders(p.proc))


def attach(p: Process, model: Any, items: list[Item], inputs: Inputs
           ) -> tuple[Trainable, Outputs]:
    """What trains (an adapter, or the model's own weights) and what a save writes."""
    if p.proc.full_fine_tune:
        from aitk.run.finetune import ModelOutputs, attach_full

        trainable = attach_full(p.proc, model, items, inputs.latents, inputs.embeds,
                                inputs.control_embeds, inputs.vary_captions, inputs.audio)
        return trainable, ModelOutputs(p.loaded, p.proc, p.out_dir, model, trainable.network)
    trainable = attach_adapter(p.proc, model, items, inputs.latents, inputs.embeds,
                               inputs.control_embeds, inputs.vary_captions, inputs.audio)
    return trainable, LoraOutputs(p.loaded, p.proc, p.out_dir, trainable.network,
                                  model.lora_file_suffixes())


def embed_slider(p: Process, model: Any) -> dict[str, Any] | None:
    """A slider's prompts, embedded before caching may unload the text encoder."""
    if getattr(p.proc, "slider", None) is None:
        return None
    from aitk.run.slider import slider_prompts

    return model.encode_prompts(slider_prompts(p.proc))


def objective_for(proc: TrainingProcess, model: Any, network: Any, inputs: Inputs,
                  slider_embeds: dict[str, Any] | None) -> LossFn:
    """The loop's loss: a slider's, else the `train:` section's (aitk.run.objectives)."""
    if slider_embeds is None:
        if proc.full_fine_tune:
            refuse_priors(proc)
        return build_objective(proc, model, network, inputs.reembed)
    from aitk.run.slider import ConceptSliderObjective, SliderObjective

    if getattr(proc, "type", None) == "concept_slider":
        return ConceptSliderObjective(network, proc.slider, slider_embeds)  # type: ignore[attr-defined]
    return SliderObjective(network, proc, slider_embeds)  # type: ignore[arg-type]


def refuse_priors(proc: TrainingProcess) -> None:
    """The prior terms compare with the base model, which a LoRA run gets by turning
    its adapter off; a full fine-tune has no untouched copy to ask (the preflight says
    so first, aitk.audit.preflight)."""
    tr = proc.train
    on = [key for key, value in (
        ("diff_output_preservation", any(preservation_rules(proc))),
        ("blank_prompt_preservation", tr.blank_prompt_preservation),
        ("inverted_mask_prior", tr.inverted_mask_prior)) if value]
    if on:
        raise ObjectiveError(f"train.{on[0]} needs the base model beside the trained one; "
                             "a full fine-tune has none: turn it off or train a LoRA")


def join_ranks(p: Process) -> torch.device:
    """This rank's device, in the process group (a no-op for one process)."""
    device = distributed.device_for(p.world, pick_device(p.proc.device))
    distributed.init(p.world, device)
    return device


def load(p: Process, device: torch.device) -> Any:
    """The model, loaded and configured for training. Rank 0 builds a missing tiny model
    first (`create_if_missing`); the others wait for it."""
    quiet_library_progress()
    if p.main:
        ensure_example_model(p.proc.model)
    distributed.barrier(p.world)
    model = load_model(p.proc, device, report=p.say)
    model.configure_training(p.proc.train)
    check_objective(p.proc.train, model)  # a loss this model cannot train: exit 2 now
    if p.main:  # per-expert file names are known once the model is loaded
        suffixes = ("",) if p.proc.full_fine_tune else model.lora_file_suffixes()
        claim(p.out_dir, p.name, suffixes, lambda m: print(m, file=p.stream, flush=True),
              folders=writes_folders(p.proc))
    return model


def offload_layers(p: Process, model: Any, role: PartRole) -> None:
    """`model.layer_offloading`: the configured share of a part's blocks waits in CPU
    memory between its visits to the device (aitk.models.block_offload)."""
    from aitk.models.block_offload import offload_part

    cfg = p.proc.model
    share = (cfg.layer_offloading_transformer_percent if role is PartRole.DENOISER
             else cfg.layer_offloading_text_encoder_percent)
    if not cfg.layer_offloading or share <= 0:
        return
    if role is PartRole.TEXT_ENCODER and not model.text_encoders():
        return
    offloader = offload_part(model, role, share)
    if offloader is None:
        p.say(f"layer_offloading: the {role.value} has no repeated blocks to offload")
        return
    if model.device.type == "cpu":
        p.say("layer_offloading on the CPU copies blocks within host memory; it saves "
              "nothing here")
    print(f"layer offloading: {len(offloader.blocks)} {role.value} blocks wait in CPU "
          "memory between their visits", file=p.stream, flush=True)


def compile_blocks(p: Process, model: Any) -> None:
    """`model.block_compile` / `compile`: torch.compile on each denoiser block."""
    from aitk.models.block_compile import CompileSettings
    from aitk.models.block_compile import compile_blocks as compile_each

    cfg = p.proc.model
    if not (cfg.compile or cfg.block_compile):
        return
    count = compile_each(model.offload_blocks(PartRole.DENOISER), CompileSettings(
        cfg.compile_mode, cfg.compile_fullgraph, cfg.compile_dynamic, cfg.cache_size_limit))
    key = "block_compile" if cfg.block_compile else "compile (aitk compiles per block)"
    print(f"{key}: {count} denoiser blocks compiled with torch.compile (the first steps "
          "take longer while they compile)", file=p.stream, flush=True)


def preview_configs(p: Process, model: Any, items: list[Item]) -> list[Any]:
    """The previews' generation settings (none with `disable_sampling`)."""
    from aitk.run.sampling import image_configs

    if items and len(items[0].controls) > 1 and not model.has_multiple_control_images:
        p.say(f"{p.proc.model.arch} takes one control image: only the first control "
              "folder is used")
    if p.proc.train.disable_sampling:
        return []
    return image_configs(p.proc.sample, p.proc.trigger_word)


def held_out_prompts(p: Process) -> list[str]:
    """The validation prompts (rank 0 alone validates), embedded with the captions."""
    from aitk.run.validation import validation_prompts

    cfg = p.proc.train.validation_config
    return validation_prompts(cfg, p.proc.trigger_word) if cfg and p.main else []


def validation(p: Process, model: Any, trainable: Trainable, inputs: Inputs,
               metrics: Metrics, start: int) -> Any:
    """The loop's `validate` on rank 0 with `validation_config`, else None."""
    from aitk.run.validation import Validation, history, hold_out

    cfg = p.proc.train.validation_config
    if cfg is None or not p.main:
        return None
    held = hold_out(model, cfg, p.proc.trigger_word, inputs.prompt_embeds, p.say)
    if not held:
        p.say("validation_config has no usable validation image; no validation loss")
        return None
    return Validation(model, held, cfg.validation_sigmas, trainable.published,
                      metrics.record, p.status, metrics.message,
                      history(p.out_dir / "loss_log.jsonl", start))


def trackers(p: Process) -> Trackers:
    """wandb and TensorBoard as the config asks (aitk.run.trackers); rank 0 only."""
    log_dir = p.proc.log_dir or p.loaded.job.config.log_dir

    def say(line: str) -> None:
        print(line, file=p.stream, flush=True)

    # the config as recorded: a ${VAR} token is never sent to a tracker
    config = p.loaded.recorded or p.loaded.raw
    return open_trackers(p.proc.logging, log_dir, p.name, p.out_dir, config, say, p.say)


def announce(p: Process, items: list[Item], device: torch.device) -> None:
    ranks = f" x {p.world.size} processes" if p.world.distributed else ""
    what = "a full fine-tune of" if p.proc.full_fine_tune else "training"
    data = (f"{len({i.path for i in items})} images ({len(items)} items with resolutions "
            "and repeats)" if items else "no images (latents from the model itself)")
    print(f"{what} {p.name}: {data}, {p.proc.train.steps} steps on {device.type}"
          f"{ranks}; outputs in {p.out_dir}", file=p.stream, flush=True)


def train_from(p: Process, model: Any, trainable: Trainable, outputs: Outputs,
               objective: LossFn, inputs: Inputs, previews: list[Any], start: int,
               device: torch.device, masks: Masks | None = None) -> Outcome:
    """The loop from step `start`, saving and previewing on rank 0."""
    from aitk.run.sampling import Previews

    tr, main = p.proc.train, p.main
    for part in trainable.network.trained_parts():
        part.train()  # adapter dropout active; previews switch to eval and back
    p.status.phase("training", step=start, total_steps=tr.steps)
    metrics = Metrics(p.out_dir / "loss_log.jsonl" if main else None, tr.steps, start,
                      p.name, stream=p.stream, status=p.status,
                      trackers=trackers(p) if main else NO_TRACKERS)
    try:
        saver = Saver(p.loaded, p.proc, p.out_dir, trainable, outputs, metrics, p.status)
        if main:
            saver.repair(start)
        # Previews at a prompt's `--m` weight need an adapter to weigh.
        weigh = None if p.proc.full_fine_tune else trainable.network.set_multiplier
        previewer = Previews(model, previews, p.out_dir / "samples", p.proc.sample.format,
                             inputs.sample_embeds, p.status, metrics.message, weigh)

        def sample(step: int) -> None:
            with trainable.published():  # the EMA's weights when it is on
                previewer(step)

        validate = validation(p, model, trainable, inputs, metrics, start)
        settings = LoopSettings(
            total_steps=tr.steps, accumulation=tr.accumulation,
            max_grad_norm=tr.max_grad_norm, save_every=p.proc.save.save_every,
            sample_every=p.proc.sample.sample_every if previews else None,
            sample_first=not tr.skip_first_sample,
            sample_start=p.proc.sample.sample_start_step, seed=tr.seed,
            validate_every=(tr.validation_config.validate_every_n_steps
                            if validate is not None else None),
            # Reading a loss syncs an accelerator; on a CPU it costs nothing.
            log_every=1 if device.type == "cpu" else 10, world=p.world)
        if start >= tr.steps:
            metrics.message(f"{p.name} already finished at step {start}")
        data, world, ema = trainable.data, p.world, trainable.ema
        attach = masks.attach if masks is not None else (lambda batch: batch)
        outcome = train(Run(
            model=model, params=trainable.params, optimizer=trainable.optimizer,
            schedule=trainable.schedule, settings=settings,
            next_batch=lambda: attach(data.next_for(world.rank, world.size)),
            save=saver.save if main else _skip, sample=sample if main else _skip,
            log=metrics.log,
            # Every rank stops at the same step when any was asked to.
            stop_requested=lambda: distributed.agree(world, p.stop.requested, device),
            requested=outside_requests(p, device),
            objective=objective,
            after_update=ema.update if ema is not None else (lambda: None),
            validate=validate or _skip),
            start)
        if validate is not None and validate.summary():
            metrics.message(validate.summary())
        save = p.proc.save
        if main and save.push_to_hub and outcome is Outcome.FINISHED:
            from aitk.run.hub import push_to_hub

            assert save.hf_repo_id is not None  # the schema requires it
            push_to_hub(p.out_dir, save.hf_repo_id, save.hf_private, metrics.message)
        # Leave together: a rank that tore its process group down while rank 0 was
        # still saving could abort in gloo's threads ("terminate called ...").
        distributed.barrier(world)
        return outcome
    finally:
        metrics.close()


def outside_requests(p: Process, device: torch.device) -> Callable[[], frozenset[Request]]:
    """"Save now" / "sample now" (aitk_common.requests): rank 0 takes them from the
    folder the server named; every rank acts on them at the same step."""
    folder = requests.folder_from_env() if p.main else None

    def poll() -> frozenset[Request]:
        mine = requests.take(folder)
        return frozenset(r for r in Request if distributed.agree(p.world, r in mine, device))

    return poll


def _skip(step: int) -> None:
    """`save` and `sample` on the ranks that do not write."""
