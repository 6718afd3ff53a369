"""run_job: build the pieces of a training run, handle Ctrl+C, return an exit code.

Exit codes: 0 finished; 1 training failed (e.g. a non-finite loss); 2 the config or its
inputs are unusable (bad key, missing dataset, unknown arch); 130 stopped by Ctrl+C or
SIGTERM after saving a checkpoint at a step boundary.

Outputs, in `training_folder/NAME/`:
    NAME.safetensors                 final LoRA (public `diffusion_model.` keys + metadata)
    NAME_000000250.safetensors       every `save_every` steps (and on Ctrl+C); the newest
                                     `max_step_saves_to_keep` are kept
    checkpoints/step_000000250/      full training state for resume (aitk.checkpoint)
    samples/000000250_0.jpg          previews
    config.yaml                      the config as run ([name] and ${VAR} replaced)
    loss_log.jsonl                   one JSON object per step: step, loss, lr, time
    status.json                      phase, step, totals, exit code (aitk.status)
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import torch

import aitk
from aitk import checkpoint as ckpt
from aitk.config import REPO_ROOT, ConfigError, LoadedConfig, ProcessConfig, dump_yaml
from aitk.data.batches import BatchSource
from aitk.data.cache import LatentCache, TextEmbedCache, default_cache_dir
from aitk.data.dataset import DatasetError, Item, scan_folder
from aitk.files import atomic_write_json, atomic_write_text
from aitk.flow_matching import NonFiniteLoss
from aitk.metrics import Metrics
from aitk.optim import OptimizerUnavailable, Schedule, build_optimizer, lr_at
from aitk.status import StatusFile, status_path
from aitk.train import LoopSettings, Outcome, Run, train

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130
RUNNING_DIR = REPO_ROOT / ".aitk-run"
TRAIN_DTYPES = {"fp32": torch.float32, "float32": torch.float32,
                "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
SAVE_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


class Interrupted(Exception):
    """Stop requested before training started (nothing new to save)."""


class JobInputError(Exception):
    """Something the config points at is unusable (exit 2)."""


# ---- Ctrl+C / SIGTERM ------------------------------------------------------------------
class StopFlag:
    """First signal: finish the step, save, exit 130. Second: stop at once.

    Stopping at once is safe because every file is published by an atomic rename:
    an interrupted save leaves only a temp folder, removed at the next start.
    """

    def __init__(self, say: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                 ) -> None:
        self.requested = False
        self.say = say

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.say(f"\n{signal.Signals(signum).name}: stopping after this step and saving a "
                 "checkpoint; press Ctrl+C again to stop at once")

    def check(self) -> None:
        if self.requested:
            raise Interrupted

    @contextmanager
    def installed(self) -> Iterator[StopFlag]:
        old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


@contextmanager
def registered(name: str, config: Path) -> Iterator[None]:
    """`.aitk-run/<pid>.json` while the job runs; the manager's `update` checks it."""
    entry = RUNNING_DIR / f"{os.getpid()}.json"
    try:
        atomic_write_json(entry, {"pid": os.getpid(), "name": name, "config": str(config),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                           time.gmtime())})
    except OSError as exc:  # a read-only checkout must not stop training
        print(f"warning: cannot register the running job in {RUNNING_DIR}: {exc}",
              file=sys.stderr)
    try:
        yield
    finally:
        entry.unlink(missing_ok=True)


# ---- model, adapter, data ---------------------------------------------------------------
def pick_device(requested: str | None) -> torch.device:
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise JobInputError(f"device {requested!r} was asked for but CUDA is not available "
                            "here; set `device: cpu` (or remove `device`)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise JobInputError(f"device {requested!r} was asked for but MPS is not available")
    return device


def ensure_example_model(proc: ProcessConfig) -> None:
    """`model.create_if_missing`: build the tiny example model folder on first use."""
    path = Path(proc.model.name_or_path).expanduser()
    if not proc.model.create_if_missing or path.exists():
        return
    if proc.model.arch != "example":
        raise JobInputError("model.create_if_missing builds only the `example` arch; "
                            f"point name_or_path at an existing {proc.model.arch} model")
    from aitk.models.example.build import build_example_model

    print(f"building the example model at {path} (create_if_missing)", file=sys.stderr)
    build_example_model(path)


def quiet_library_progress() -> None:
    """Loading a local folder is quick; per-file bars would bury the training output."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()


def load_model(proc: ProcessConfig, device: torch.device,
               report: Callable[[str], None] | None = None) -> Any:
    from aitk.models import registry

    # `report` shows broken extensions even when the requested arch loads fine.
    model_cls = registry.get_model_class(proc.model.arch, report=report)
    model = model_cls(proc.model, device=device, dtype=TRAIN_DTYPES[proc.train.dtype])
    model.load_model()
    return model


def create_network(model: Any, proc: ProcessConfig) -> Any:
    from aitk.adapters import AdapterNetwork

    net = proc.network
    # The adapter reads upstream's names; hand it the resolved rank/alpha aliases.
    spec = SimpleNamespace(type=net.type, linear=net.dim, linear_alpha=net.scale_alpha,
                           dropout=net.dropout or 0.0, lokr_factor=net.lokr_factor,
                           network_kwargs=net.network_kwargs.model_dump(exclude_none=True))
    return AdapterNetwork.attach(model, spec)


def enable_gradient_checkpointing(module: torch.nn.Module) -> None:
    if hasattr(module, "enable_gradient_checkpointing"):
        module.enable_gradient_checkpointing()
    else:
        module.gradient_checkpointing = True


def scan_datasets(proc: ProcessConfig, divisibility: int,
                  report: Callable[[str], None]) -> list[Item]:
    items: list[Item] = []
    for ds in proc.datasets:
        items += scan_folder(Path(ds.folder_path).expanduser(), caption_ext=ds.caption_ext,
                             default_caption=ds.default_caption,
                             trigger_word=ds.trigger_word or proc.trigger_word,
                             resolutions=ds.resolutions, divisibility=divisibility,
                             caption_dropout_rate=ds.caption_dropout_rate,
                             num_repeats=ds.num_repeats, report=report)
    return items


class Reporter:
    """Each distinct message once (unreadable images, missing captions)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            print(f"warning: {message}", file=self.stream, flush=True)


# ---- caches ---------------------------------------------------------------------------
def model_identity(model: Any) -> str:
    """The model's cache-key fingerprint. File digests are remembered in the cache folder
    (by path, size and mtime), so a multi-GB model is hashed once, not at every start."""
    return model.identity(digest_cache=default_cache_dir(REPO_ROOT) / "model_digests.json")


def cached_latents(proc: ProcessConfig, model: Any, items: list[Item], stop: StopFlag,
                   say: Callable[[str], None], stream: TextIO
                   ) -> Callable[[Sequence[Item]], torch.Tensor] | None:
    """Encode every image once (memory, and disk with `cache_latents_to_disk`); None
    when no dataset asks for caching: the loop then encodes each batch."""
    if not any(ds.cache_latents or ds.cache_latents_to_disk for ds in proc.datasets):
        return None
    to_disk = any(ds.cache_latents_to_disk for ds in proc.datasets)
    folder = default_cache_dir(REPO_ROOT) / "latents" if to_disk else None
    cache = LatentCache(model.encode_images, model_identity(model), model.latent_space_version,
                        folder, report=say)
    print(f"caching latents for {len(set(items))} image sizes", file=stream, flush=True)
    cache.fill(items, stop=stop.check)
    return cache.get


def text_embeddings(proc: ProcessConfig, model: Any, items: list[Item],
                    samples: list[Any], stop: StopFlag, say: Callable[[str], None]
                    ) -> tuple[Callable[[list[str]], Any], dict[str, Any] | None]:
    """(captions -> batch embeds, embeds for the preview prompts or None).

    With `cache_text_embeddings` (or `unload_text_encoder`), every caption the run can
    use (the empty one for caption dropout, the preview prompts) is embedded up front and
    the text encoder is unloaded; otherwise captions are embedded per batch."""
    tr = proc.train
    wanted = tr.cache_text_embeddings or tr.unload_text_encoder
    if not (wanted or any(ds.cache_text_embeddings for ds in proc.datasets)):
        def embed(captions: list[str]) -> Any:
            with torch.no_grad():
                return model.get_prompt_embeds(captions).detach()

        return embed, None
    captions = [i.caption for i in items]
    if any(i.caption_dropout_rate > 0 for i in items):
        captions.append("")
    captions += [t for c in samples for t in (c.prompt, c.negative_prompt)]
    cache = TextEmbedCache(model.encode_prompts, model_identity(model),
                           model.text_embedding_space_version,
                           default_cache_dir(REPO_ROOT) / "text_embeds", report=say)
    cache.fill(captions, stop=stop.check)
    model.unload_text_encoder()  # every caption is cached: free its memory
    return cache.get, cache.mapping()


# ---- saving ---------------------------------------------------------------------------
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
    }


def step_lora_name(name: str, step: int) -> str:
    return f"{name}_{step:09d}.safetensors"


def prune_step_loras(out_dir: Path, name: str, keep: int) -> None:
    prefix = f"{name}_"
    # Not glob(): a name like "lora[v2]" would read as a pattern and match nothing.
    found = sorted(p for p in out_dir.iterdir()
                   if p.suffix == ".safetensors" and p.stem.startswith(prefix)
                   and p.stem[len(prefix):].isdigit() and len(p.stem) == len(prefix) + 9)
    for old in found[:-keep]:
        old.unlink(missing_ok=True)


def checkpoint_files(network: Any, optimizer: torch.optim.Optimizer, data: BatchSource,
                     step: int, schedule: Schedule, loaded: LoadedConfig) -> dict[str, bytes]:
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
        "state.json": json.dumps(state, indent=2).encode()}


def restore(found: ckpt.Checkpoint, network: Any, optimizer: torch.optim.Optimizer,
            data: BatchSource) -> None:
    from safetensors.torch import load

    from aitk.adapters import AdapterError

    try:
        network.load_state_dict(load(found.read("adapter.safetensors")))
    except AdapterError as exc:
        raise JobInputError(
            f"checkpoint {found.path} was trained with another network config ({exc}); "
            "change `config.name` or `training_folder` to start a new run") from None
    optimizer.load_state_dict(torch.load(io.BytesIO(found.read("optimizer.pt")),
                                         weights_only=True))
    data.load_state_dict(found.state()["data"])
    # Last, after everything that draws random numbers while being built.
    ckpt.restore_rng(torch.load(io.BytesIO(found.read("rng.pt")), weights_only=True))


# ---- one process ----------------------------------------------------------------------
def run_process(loaded: LoadedConfig, proc: ProcessConfig, stop: StopFlag,
                stream: TextIO, status: StatusFile | None = None) -> Outcome:
    from aitk.sampling import image_configs, write_samples

    say = Reporter(stream)
    name = loaded.name
    out_dir = Path(proc.training_folder).expanduser() / name
    device = pick_device(proc.device)
    quiet_library_progress()
    ensure_example_model(proc)
    model = load_model(proc, device, report=say)
    stop.check()

    items = scan_datasets(proc, model.get_bucket_divisibility(), say)
    tr = proc.train
    samples = [] if tr.disable_sampling else image_configs(proc.sample, proc.trigger_word)
    status = status or StatusFile(None)
    status.phase("caching")
    latents = cached_latents(proc, model, items, stop, say, stream)
    embeds, sample_embeds = text_embeddings(proc, model, items, samples, stop, say)

    torch.manual_seed(tr.seed)  # adapter init; a resume overwrites both
    network = create_network(model, proc)
    trained = model.get_model_to_train()
    if tr.gradient_checkpointing:
        enable_gradient_checkpointing(trained)
    params = list(network.trainable_parameters())
    opt = tr.optimizer_params
    optimizer = build_optimizer(tr.optimizer, params, tr.lr, opt.weight_decay, opt.betas,
                                opt.eps)
    schedule = Schedule(tr.lr, tr.steps, tr.lr_scheduler,
                        tr.lr_scheduler_params.warmup_steps, tr.lr_scheduler_params.eta_min)
    data = BatchSource(items, tr.batch_size, tr.seed, latents, model.encode_images, embeds)

    ckpt_root = out_dir / "checkpoints"
    ckpt.clean_stale(ckpt_root)
    found = ckpt.find_resumable(ckpt_root, report=say)
    start = 0
    if found is not None:
        restore(found, network, optimizer, data)
        start = found.step
        print(f"resuming {name} from step {start} ({found.path})", file=stream, flush=True)
    atomic_write_text(out_dir / "config.yaml", dump_yaml(loaded.recorded))
    print(f"training {name}: {len({i.path for i in items})} images ({len(items)} items with "
          f"resolutions and repeats), {tr.steps} steps on {device.type}; outputs in {out_dir}",
          file=stream, flush=True)
    trained.train()  # adapter dropout active; previews switch to eval and back
    status.phase("training", step=start, total_steps=tr.steps)
    metrics = Metrics(out_dir / "loss_log.jsonl", tr.steps, start, name, stream=stream,
                      status=status)
    save_dtype = SAVE_DTYPES[proc.save.dtype]

    def lora_path(step: int) -> Path:
        return out_dir / (f"{name}.safetensors" if step >= tr.steps
                          else step_lora_name(name, step))

    def save(step: int) -> None:
        status.phase("saving")
        meta = lora_metadata(loaded, proc, step, data.epoch)
        ckpt.save_checkpoint(ckpt_root, step,
                             checkpoint_files(network, optimizer, data, step, schedule, loaded))
        lora = lora_path(step)
        network.save_file(lora, meta, dtype=save_dtype)  # atomic, public keys
        ckpt.prune(ckpt_root, proc.save.max_step_saves_to_keep)
        prune_step_loras(out_dir, name, proc.save.max_step_saves_to_keep)
        metrics.message(f"saved {lora.name} and checkpoint {ckpt.dir_name(step)}")
        status.phase("training")

    def sample(step: int) -> None:
        status.phase("sampling")
        paths = write_samples(model, samples, out_dir / "samples", step, proc.sample.format,
                              sample_embeds)
        metrics.message(f"wrote {len(paths)} samples for step {step}")
        status.phase("training")

    if start > 0 and not lora_path(start).exists():
        # A save cut between its checkpoint and its LoRA file (second Ctrl+C, crash):
        # the checkpoint holds the same weights, and the loop will not save this step.
        network.save_file(lora_path(start), lora_metadata(loaded, proc, start, data.epoch),
                          dtype=save_dtype)
        metrics.message(f"wrote {lora_path(start).name} (missing after an interrupted save)")

    settings = LoopSettings(
        total_steps=tr.steps, accumulation=tr.accumulation, max_grad_norm=tr.max_grad_norm,
        save_every=proc.save.save_every,
        sample_every=proc.sample.sample_every if samples else None,
        sample_first=not tr.skip_first_sample, seed=tr.seed, timestep_type=tr.timestep_type)
    try:
        if start >= tr.steps:
            metrics.message(f"{name} already finished at step {start}")
        return train(Run(model=model, params=params, optimizer=optimizer, schedule=schedule,
                         settings=settings, next_batch=data.next, save=save, sample=sample,
                         log=metrics.log, stop_requested=lambda: stop.requested), start)
    finally:
        metrics.close()


# ---- the job --------------------------------------------------------------------------
KNOWN_ERRORS: dict[type[BaseException], int] = {
    ConfigError: EXIT_CONFIG, JobInputError: EXIT_CONFIG, DatasetError: EXIT_CONFIG,
    OptimizerUnavailable: EXIT_CONFIG, NonFiniteLoss: EXIT_FAILED,
}


def _known_error_code(exc: BaseException) -> int | None:
    for cls, code in KNOWN_ERRORS.items():
        if isinstance(exc, cls):
            return code
    from aitk.adapters import AdapterError
    from aitk.models.base import ModelError

    # A model folder that does not load, an unknown arch, a network that matches no
    # layer: all inputs the user can fix.
    return EXIT_CONFIG if isinstance(exc, ModelError | AdapterError) else None


def run_job(loaded: LoadedConfig, stream: TextIO | None = None) -> int:
    """Run every process of one config; returns the exit code (never raises)."""
    stream = stream or sys.stderr  # looked up now: --log swaps sys.stderr for a tee
    first = loaded.job.config.process[0]
    status = StatusFile(status_path(Path(first.training_folder).expanduser() / loaded.name),
                        loaded.name)
    status.phase("loading")
    code = _run_job(loaded, stream, status)
    status.finish(code, error=status.fields["error"], problems=status.fields["errors"])
    return code


def _run_job(loaded: LoadedConfig, stream: TextIO, status: StatusFile) -> int:
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=stream)
    stop = StopFlag(say=lambda m: print(m, file=stream, flush=True))
    try:
        with stop.installed(), registered(loaded.name, loaded.source):
            for proc in loaded.job.config.process:
                if run_process(loaded, proc, stop, stream, status) is Outcome.STOPPED:
                    print(f"stopped; run the same config again to resume {loaded.name}",
                          file=stream)
                    return EXIT_INTERRUPTED
        return EXIT_OK
    except (Interrupted, KeyboardInterrupt):
        print(f"stopped; run the same config again to resume {loaded.name}", file=stream)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the job's error boundary
        code = _known_error_code(exc)
        if code is None:
            import traceback

            traceback.print_exc(file=stream)
            print(f"error: {loaded.name} failed: {exc.__class__.__name__}: {exc}",
                  file=stream)
            status.fields["error"] = f"{exc.__class__.__name__}: {exc}"
            return EXIT_FAILED
        print(f"error: {exc}", file=stream)
        status.fields["error"] = str(exc)
        if isinstance(exc, ConfigError):
            status.fields["errors"] = exc.problems
        return code
