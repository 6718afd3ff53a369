"""Preflight: everything about a loaded job that can be known without model weights,
checked before anything loads, every problem listed at once. Training jobs (LoRA, full
fine-tune, sliders) get the checks below; the jobs that read and write model and LoRA
files (extract, mod, merge, generate) get theirs from aitk.audit.file_jobs.

- the device asked for exists (torch is imported only for an explicit cuda/mps device);
- the optimizer can be built (adamw8bit needs bitsandbytes);
- each dataset folder exists and holds usable images with captions; control folders pair;
- each preview's control image (ctrl_img, ctrl_img_1..3) exists;
- the output folder is writable, and what it already holds (a run to resume, a finished
  LoRA, files this run would overwrite);
- free disk space for checkpoints;
- quantizing has optimum-quanto to do it (the schema holds the qtype to aitk's list);
- `model.model_kwargs` fit the arch's typed knobs (aitk.models.description);
- differential output preservation has a trigger word to replace in every dataset it
  applies to;
- `train.train_text_encoder` is asked only of an arch with a text-encoder LoRA;
- the run's memory forecast (aitk.memory.forecast) fits the device's and the host's
  free memory, else the cheapest changes that make it fit (an error on a GPU, a
  warning on a CPU run).
- what a full fine-tune trains can be trained (no quantized weights, something chosen),
  and a LoRA run says when it ignores `train_unet`.

The schema and the arch were checked by `load_config` already. `run.py` calls this
before `run_job`; `run.py --check` runs only this.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from aitk.audit.dataset import DatasetOptions, audit_dataset
from aitk.config import optimizers
from aitk.config.kinds import TRAINING_KINDS
from aitk.config.loading import LoadedConfig
from aitk.config.schema import ModelConfig, TrainingProcess
from aitk.findings import Finding, Level, error, info, warning

MIN_FREE_BYTES = 512 * 1024 * 1024  # a LoRA checkpoint set fits; less is a warning
CHECKPOINT_PREFIX = "step_"  # aitk.run.checkpoint's directory names (that module hashes)
PreflightCheck = Callable[[str, TrainingProcess, LoadedConfig], list[Finding]]


def _device(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    return device_findings(f"{where}.device", proc.device)


def device_findings(path: str, requested: str | None) -> list[Finding]:
    """The device a config asks for (`path` its field) exists here."""
    if requested is None or requested == "cpu":
        return []
    kind, _, index_text = requested.partition(":")
    where = path.rsplit(".", 1)[0] if path.endswith(".device") else path
    if kind not in ("cuda", "mps") or (":" in requested and not (
            kind == "cuda" and index_text.isdigit() and index_text.isascii())):
        return [error(f"{where}.device", f"unknown device {requested!r}",
                      "use cpu, cuda, cuda:N or mps (or remove `device`)", "device")]
    import torch  # needed: only torch knows whether the device is there

    if kind == "cuda":
        if not torch.cuda.is_available():
            return [error(f"{where}.device", f"{requested!r} was asked for but CUDA is not "
                          "available here", "set `device: cpu` or remove `device`",
                          "device")]
        index = int(index_text or 0)
        if index >= torch.cuda.device_count():
            return [error(f"{where}.device", f"{requested!r}: this machine has "
                          f"{torch.cuda.device_count()} CUDA device(s)", "pick one that "
                          "exists", "device")]
    elif not torch.backends.mps.is_available():
        return [error(f"{where}.device", f"{requested!r} was asked for but MPS is not "
                      "available here", "set `device: cpu`", "device")]
    return []


def _optimizer(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    spec = optimizers.OPTIMIZERS[proc.train.optimizer]
    missing = optimizers.missing_packages(spec)
    if missing:
        names = " and ".join(p.name for p in missing)
        return [error(f"{where}.train.optimizer", f"{spec.name} needs {names}, which "
                      f"{'is' if len(missing) == 1 else 'are'} not installed",
                      "run `python -m manager sync`, or use `optimizer: adamw`",
                      "optimizer")]
    return []


def _datasets(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    out: list[Finding] = []
    for j, ds in enumerate(proc.datasets):
        path = f"{where}.datasets[{j}]"
        controls = [Path(p).expanduser() for p in ds.control_paths]
        report = audit_dataset(DatasetOptions(
            Path(ds.folder_path).expanduser(), controls=controls, resolutions=ds.resolutions,
            arch=proc.model.arch, caption_ext=ds.caption_ext,
            default_caption=ds.default_caption, quick=True, videos=ds.num_frames > 1,
            scale=ds.scale, square_crop=ds.square_crop))
        out += _summarised(f"{path}.folder_path", report.findings)
    return out


def _sample_controls(where: str, proc: TrainingProcess, loaded: LoadedConfig
                     ) -> list[Finding]:
    """Each preview's ctrl_img / ctrl_img_1..3 names a file (an edit preview needs it)."""
    out = []
    for j, item in enumerate(proc.sample.samples or []):
        for key in ("ctrl_img", "ctrl_img_1", "ctrl_img_2", "ctrl_img_3"):
            value = getattr(item, key)
            if value and not Path(value).expanduser().is_file():
                out.append(error(f"{where}.sample.samples[{j}].{key}", f"control image "
                                 f"{value} does not exist", "point it at an image file",
                                 "missing_ctrl_img"))
    return out


# Dataset findings that stop a run. The trainer skips an unreadable or too-small image
# and an image without its control image (reported once; aitk.data.controls), so those
# warn; a control folder that does not exist stops it.
BLOCKING_DATASET_CODES = frozenset({"missing_folder", "unlisted_folder", "no_images",
                                    "missing_control_folder"})


def _summarised(path: str, findings: list[Finding]) -> list[Finding]:
    """One finding per kind: "3 files: no caption file ... (a.png, b.png, ...)"."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        if f.level is not Level.INFO:
            groups.setdefault(f.code or f.message, []).append(f)
    out = []
    for items in groups.values():
        first = items[0]
        if first.level is Level.ERROR and first.code not in BLOCKING_DATASET_CODES:
            first = Finding(Level.WARNING, first.path, f"{first.message}; skipped",
                            first.fix, first.code)
        if len(items) == 1:
            out.append(Finding(first.level, path, f"{first.path}: {first.message}",
                               first.fix, first.code))
            continue
        names = ", ".join(f.path for f in items[:3]) + (", ..." if len(items) > 3 else "")
        out.append(Finding(first.level, path, f"{len(items)} files: {first.message} "
                           f"({names}; `python -m aitk audit dataset` lists them)",
                           first.fix, first.code))
    return out


def nearest_existing(target: Path) -> tuple[Path, bool]:
    """The nearest existing path at or above `target`, and whether it is a folder this
    process can write into (so `target` can be made)."""
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing, existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def _output(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    out_dir = Path(proc.training_folder).expanduser() / loaded.name
    path = f"{where}.training_folder"
    existing, writable = nearest_existing(out_dir)
    if not writable:
        return [error(path, f"{out_dir} cannot be written ({existing} is not a writable "
                      "folder)", "point training_folder somewhere writable", "output")]
    found: list[Finding] = []
    ckpts = out_dir / "checkpoints"
    steps = sorted(int(p.name[len(CHECKPOINT_PREFIX):]) for p in
                   (ckpts.iterdir() if ckpts.is_dir() else [])
                   if p.name.startswith(CHECKPOINT_PREFIX)
                   and p.name[len(CHECKPOINT_PREFIX):].isdigit())
    final = out_dir / f"{loaded.name}.safetensors"
    if steps and steps[-1] >= proc.train.steps:
        found.append(info(path, f"{out_dir} holds a finished run (step {steps[-1]}): "
                          "nothing to train", "change `name` or `training_folder` to start "
                          "a new run", "finished"))
    elif steps:
        found.append(info(path, f"{out_dir} holds checkpoints up to step {steps[-1]}: the "
                          "run resumes from the newest that validates",
                          "change `name` or `training_folder` to start over", "resume"))
    elif final.exists() or any(out_dir.glob("*.safetensors")):
        found.append(warning(path, f"{out_dir} holds LoRA files but no checkpoint: this run "
                             "starts over and overwrites them", "change `name` or "
                             "`training_folder` to keep them", "overwrite"))
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        found.append(warning(path, f"only {free // (1024 * 1024)} MiB free at {existing}; "
                             "checkpoints may not fit", "free some space", "disk"))
    return found


def _model(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    return model_findings(f"{where}.model", proc.model)


def model_findings(where: str, model: ModelConfig) -> list[Finding]:
    """A model the config names is there (a folder or file), or could be a hub id."""
    name = model.name_or_path
    if looks_missing(name) and not model.create_if_missing:
        return [error(f"{where}.name_or_path", f"model folder {name} does not exist",
                      "point name_or_path at a model folder or a hub id (org/name)",
                      "model")]
    return []


def looks_missing(name: str) -> bool:
    """A local path that is not there (an `org/name` that is not a path may be a hub id)."""
    path = Path(name).expanduser()
    looks_local = name.startswith(("/", "./", "../", "~")) or path.is_absolute() or \
        name.count("/") != 1
    return looks_local and not path.exists()


_LIBRARY = {"quanto": ("optimum.quanto", "optimum-quanto"),
            "torchao": ("torchao", "torchao"), "uintx": ("torchao", "torchao")}


def _quantize(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    """The schema holds qtype to aitk.models.qtypes; quantizing also needs the library
    that qtype names installed here."""
    from aitk.models.qtypes import parse_qtype

    model = proc.model
    for key, on, qtype in (("quantize", model.quantize, model.qtype),
                           ("quantize_te", model.quantize_te, model.qtype_te)):
        module, package = _LIBRARY[parse_qtype(qtype).qtype.backend]
        if on and importlib.util.find_spec(module) is None:
            return [error(f"{where}.model.{key}", f"qtype {qtype.split('|')[0]} needs "
                          f"{package}, which is not installed",
                          "run `python3 -m manager sync` or set quantize: false", "qtype")]
    return []


def _recovery_adapter(where: str, proc: TrainingProcess, loaded: LoadedConfig
                      ) -> list[Finding]:
    """An accuracy recovery adapter that is neither a file here nor a hub name that can
    be had (offline with nothing cached) is found before anything loads."""
    spec = proc.model.recovery_adapter
    if not spec or Path(spec).expanduser().is_file():
        return []
    field = f"{where}.model.qtype" if "|" in proc.model.qtype else \
        f"{where}.model.accuracy_recovery_adapter"
    parts = spec.split("/")
    if spec.startswith((".", "/", "~")) or len(parts) not in (2, 3) or not all(parts):
        return [error(field, f"accuracy recovery adapter {spec} does not exist",
                      "point it at a .safetensors file or owner/repo/file on the hub",
                      "model")]
    from huggingface_hub import constants, try_to_load_from_cache

    # aitk.models.assistant.resolve_adapter_file's rule (not imported: it needs torch)
    filename = parts[2] if len(parts) == 3 else "pytorch_lora_weights.safetensors"
    cached = try_to_load_from_cache(f"{parts[0]}/{parts[1]}", filename)
    if isinstance(cached, str) or not constants.HF_HUB_OFFLINE:
        return []  # cached, or downloaded when the model loads
    return [error(field, f"accuracy recovery adapter {spec} is not cached and "
                  "HF_HUB_OFFLINE is set", "download it first (huggingface-cli download) "
                  "or point at a local file", "model")]


def _model_kwargs(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    """`model.model_kwargs` against the arch's typed knobs (its torch-free description),
    so a misspelt knob is found before the model loads. An extension's arch says at load."""
    from aitk.models import catalog

    if proc.model.arch not in catalog.builtin_archs():
        return []
    out = []
    for line in catalog.validate_model_kwargs(proc.model.arch, proc.model.model_kwargs):
        path, _, message = line.partition(": ")
        out.append(error(f"{where}.{path}", message, "", "model_kwargs"))
    return out


def _preservation(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    """DOP swaps the trigger word for the class word: a dataset it applies to without a
    trigger word would train nothing but the class prompt."""
    out = []
    for i, ds in enumerate(proc.datasets):
        if ds.trigger_word or proc.trigger_word:
            continue
        if ds.diff_output_preservation:
            path = f"{where}.datasets[{i}].diff_output_preservation"
        elif proc.train.diff_output_preservation:
            path = f"{where}.train.diff_output_preservation"
        else:
            continue
        out.append(error(path, f"needs a trigger word to replace with the class word "
                         f"(datasets[{i}] has none)", "set trigger_word", "preservation"))
    return list({f.path: f for f in out}.values())  # once per field


def _text_encoder(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    """Text encoders train only where the arch has a text-encoder LoRA (its
    description); a text-encoder rate without them is unused. The `noise_scheduler` is
    the arch's fact checked at load (aitk.config.archfit)."""
    from aitk.models import catalog

    arch, tr = proc.model.arch, proc.train
    if arch not in catalog.builtin_archs() or proc.full_fine_tune:  # see _trained_parts
        return []
    out = []
    if tr.train_text_encoder and not catalog.trains_text_encoders(arch):
        out.append(error(f"{where}.train.train_text_encoder", f"arch {arch} trains its "
                         "denoiser only (it has no text-encoder LoRA)",
                         "remove train_text_encoder", "train_text_encoder"))
    if tr.text_encoder_lr is not None and not tr.train_text_encoder:
        out.append(warning(f"{where}.train.text_encoder_lr", "no text encoder trains "
                           "(train_text_encoder is off): this rate is not used",
                           "remove it, or set train_text_encoder: true", "train_text_encoder"))
    return out


def _memory(where: str, proc: TrainingProcess, loaded: LoadedConfig) -> list[Finding]:
    """A run whose forecast peak is over the free memory stops here, naming the cheapest
    changes that make it fit (aitk.memory.forecast.hints)."""
    from aitk.memory.plan import gib, memory_forecast

    found = memory_forecast(proc)
    if found is None or found.fits is not False:
        return []
    if found.device_free_bytes is not None and \
            found.device_peak_bytes > found.device_free_bytes:
        where_ = "host memory" if found.device == "cpu" else f"{found.device} memory"
        need, free = found.device_peak_bytes, found.device_free_bytes
    else:
        where_, need, free = "host memory", found.host_peak_bytes, found.host_free_bytes or 0
    fix = " or ".join(found.hints) if found.hints else \
        "a machine with more memory (no single change of this job is enough)"
    # A GPU run that will not fit stops here. A CPU run only warns: the host may swap
    # or overcommit, and the loaders' own errors (a hub id offline) say more.
    level = warning if found.device == "cpu" else error
    return [level(f"{where}.model", f"this run is forecast to need {gib(need)} of "
                  f"{where_} at its peak; {gib(free)} is free", fix, "memory")]


def _trained_parts(where: str, proc: TrainingProcess, loaded: LoadedConfig
                   ) -> list[Finding]:
    """A full fine-tune trains the model's own weights: what it needs; a LoRA run says
    when it ignores the full fine-tune's switches."""
    tr, model, path = proc.train, proc.model, f"{where}.train"
    if not proc.full_fine_tune:
        out = []
        if not tr.train_unet:
            out.append(warning(f"{path}.train_unet", "a LoRA run always trains the "
                               "denoiser's adapter; ignored", "remove it", "upstream_only"))
        return out
    out = []
    if model.quantize:
        out.append(error(f"{where}.model.quantize", "a full fine-tune updates the "
                         "denoiser's weights, which quantized layers cannot take",
                         "set quantize: false (quantize_te may stay)", "full_fine_tune"))
    if model.assistant_lora_path:
        out.append(error(f"{where}.model.assistant_lora_path", "a full fine-tune would "
                         "save the assistant LoRA merged into the model", "remove it",
                         "full_fine_tune"))
    if not (tr.train_unet or tr.train_text_encoder):
        out.append(error(f"{path}.train_unet", "train_unet and train_text_encoder are both "
                         "off: nothing to train", "set train_unet: true", "full_fine_tune"))
    if tr.train_text_encoder and proc.save.save_format != "diffusers":
        out.append(error(f"{where}.save.save_format", "one safetensors file holds the "
                         "denoiser only: the trained text encoder would not be saved",
                         "set save_format: diffusers", "full_fine_tune"))
    # The prior terms ask the base model, which a LoRA run gets by turning its adapter
    # off; a full fine-tune keeps no untouched copy (aitk.run.process.refuse_priors).
    priors = [(f"{path}.{key}", key) for key in (
        "diff_output_preservation", "blank_prompt_preservation", "inverted_mask_prior")
        if getattr(tr, key)]
    priors += [(f"{where}.datasets[{i}].diff_output_preservation", "diff_output_preservation")
               for i, ds in enumerate(proc.datasets) if ds.diff_output_preservation]
    out += [error(field, f"{key} compares with the base model, which a full fine-tune "
                  "does not keep", "turn it off, or train a LoRA", "full_fine_tune")
            for field, key in priors]
    return out


def _rates_and_start(where: str, proc: TrainingProcess, loaded: LoadedConfig
                     ) -> list[Finding]:
    """A pretrained or fused LoRA that is not there is found before the model loads; a denoiser
    rate with no denoiser training is said."""
    out = []
    start = proc.network.pretrained_lora_path if proc.network is not None else None
    if start and not Path(start).expanduser().is_file():
        out.append(error(f"{where}.network.pretrained_lora_path", f"{start} is not a file "
                         "(the LoRA the adapter starts from)", "point it at a .safetensors "
                         "LoRA of this arch, or remove it", "network"))
    fused = proc.model.lora_path
    parts = (fused or "").split("/")
    hub = not (fused or "").startswith((".", "/", "~")) and len(parts) in (2, 3) and \
        all(parts)  # aitk.models.assistant.resolve_adapter_file's rule
    if fused and not Path(fused).expanduser().is_file() and not hub:
        out.append(error(f"{where}.model.lora_path", f"{fused} does not exist (the LoRA "
                         "fused into the model before training)", "point it at a "
                         ".safetensors LoRA of this arch, or remove it", "model"))
    if proc.full_fine_tune and proc.train.unet_lr is not None and not proc.train.train_unet:
        out.append(warning(f"{where}.train.unet_lr", "the denoiser does not train "
                           "(train_unet is off): this rate is not used", "remove it, or "
                           "set train_unet: true", "full_fine_tune"))
    return out


CHECKS: tuple[PreflightCheck, ...] = (_device, _optimizer, _model, _model_kwargs,
                                      _text_encoder, _datasets, _sample_controls, _output,
                                      _quantize, _recovery_adapter, _preservation, _memory,
                                      _trained_parts, _rates_and_start)


def preflight(loaded: LoadedConfig) -> list[Finding]:
    """Every finding for every process, errors first."""
    findings: list[Finding] = []
    if loaded.kind in TRAINING_KINDS:
        for i, proc in enumerate(loaded.job.processes):
            where = f"config.process[{i}]"
            for check in CHECKS:
                findings += check(where, proc, loaded)
    else:
        from aitk.audit.file_jobs import file_job_findings

        findings += file_job_findings(loaded)
    order = {Level.ERROR: 0, Level.WARNING: 1, Level.INFO: 2}
    return sorted(findings, key=lambda f: order[f.level])
