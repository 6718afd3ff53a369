"""run_job: build the pieces of a training run, handle Ctrl+C, return an exit code.

Exit codes: 0 finished; 1 training failed (e.g. a non-finite loss, a full disk); 2 the
config or its inputs are unusable (bad key, missing dataset, unknown arch, the output
folder in use by another trainer, checkpoints that exist but none validates); 130
stopped by Ctrl+C, SIGTERM or SIGHUP (SIGBREAK on Windows) after saving a checkpoint at
a step boundary.

Outputs, in `training_folder/NAME/`:
    NAME.safetensors                 final LoRA (public `diffusion_model.` keys + metadata)
    NAME_000000250.safetensors       every `save_every` steps (and on Ctrl+C); the newest
                                     `max_step_saves_to_keep` are kept
    checkpoints/step_000000250/      full training state for resume (aitk.run.checkpoint)
    samples/000000250_0.jpg          previews
    config.yaml                      the config as run ([name] replaced, ${VAR} kept)
    loss_log.jsonl                   one JSON object per step: step, loss, lr, time
    .aitk.lock, .aitk.lock.json      one trainer per output folder; who holds it
    status.json                      phase, step, totals, exit code (aitk.run.status)

The trainer only removes or overwrites files it recognises as its own: checkpoints by
their manifest (aitk.run.checkpoint), LoRA files by their `software` metadata, config.yaml
by its first line, previews by their EXIF mark (aitk.run.sampling), the loss log by its lines
(aitk.run.metrics). Anything else in the output folder is left as it is.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import torch

import aitk
from aitk.config.loading import REPO_ROOT, ConfigError, LoadedConfig, ProcessConfig, dump_yaml
from aitk.data import controls
from aitk.data.batches import BatchSource
from aitk.data.cache import LatentCache, TextEmbedCache, default_cache_dir
from aitk.data.dataset import DatasetError, Item, scan_folder
from aitk.diffusion.noise import NonFiniteLoss
from aitk.files import (
    DiskFull,
    atomic_write_json,
    atomic_write_text,
    check_free_space,
    is_disk_full,
)
from aitk.run import checkpoint as ckpt
from aitk.run import distributed, provenance
from aitk.run.metrics import Metrics
from aitk.run.optim import OptimizerUnavailable, Schedule, build_optimizer, lr_at
from aitk.run.ownership import CONFIG_HEADER, lora_is_ours
from aitk.run.status import StatusFile, status_path
from aitk.run.train import LoopSettings, Outcome, Run, train

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


# ---- Ctrl+C / SIGTERM / SIGHUP ----------------------------------------------------------
# SIGHUP: the terminal was closed (or the launcher that started us was); SIGBREAK:
# Ctrl+Break or the launcher's CTRL_BREAK_EVENT on Windows. All mean "stop, but save".
STOP_SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK")


def stop_signals(signals: Any = signal) -> tuple[int, ...]:
    """The stop-and-save signals this OS has (Windows: SIGINT, SIGTERM, SIGBREAK)."""
    return tuple(getattr(signals, n) for n in STOP_SIGNAL_NAMES if hasattr(signals, n))


STOP_SIGNALS = stop_signals()


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
        try:  # after SIGHUP the terminal may be gone: saving matters more than saying so
            self.say(f"\n{signal.Signals(signum).name}: stopping after this step and "
                     "saving a checkpoint; press Ctrl+C again to stop at once")
        except (OSError, ValueError):
            pass

    def check(self) -> None:
        if self.requested:
            raise Interrupted

    @contextmanager
    def installed(self) -> Iterator[StopFlag]:
        old = {s: signal.signal(s, self.handle) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


class LenientStream:
    """The console for as long as there is one. After SIGHUP the terminal (or the pipe to
    the launcher) may be gone and every write fails (EIO, EPIPE): the output is then
    dropped, so a lost progress line never costs the save that the signal asked for."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):
                self.lost = True
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.lost = True

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno: the real stream's
        return getattr(self._stream, name)


@contextmanager
def registered(name: str, config: Path) -> Iterator[None]:
    """`.aitk-run/<pid>.json` while the job runs; the manager's `update` checks it."""
    entry = RUNNING_DIR / f"{os.getpid()}.json"
    try:
        atomic_write_json(entry, {"pid": os.getpid(), "name": name, "config": str(config),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                           time.gmtime())})
    except OSError as exc:  # a read-only checkout must not stop training
        print(f"warning: cannot register the running job in {RUNNING_DIR}: "
              f"{exc.strerror or exc}", file=sys.stderr)
    try:
        yield
    finally:
        with suppress(OSError):
            entry.unlink(missing_ok=True)


# ---- the output folder: one trainer at a time, only our own files touched ------------
LOCK_NAME = ".aitk.lock"


def _holder_text(out_dir: Path) -> str:
    try:
        holder = json.loads((out_dir / f"{LOCK_NAME}.json").read_text(encoding="utf-8"))
        return (f"pid {holder['pid']}, started {holder['started']}, config "
                f"{holder['config']}")
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


@contextmanager
def output_lock(out_dir: Path, config: Path) -> Iterator[None]:
    """Hold `out_dir/.aitk.lock` for the whole run: two trainers writing one folder would
    mix their checkpoints into one LoRA. The OS drops the lock when its holder dies (even
    by kill -9), so a stale lock never blocks a resume."""
    from filelock import FileLock, Timeout

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(out_dir / LOCK_NAME))
        lock.acquire(timeout=0)
    except Timeout:
        raise JobInputError(
            f"output folder {out_dir} is in use by another trainer ({_holder_text(out_dir)}); "
            "wait for it to finish (or stop it), or give this run another name") from None
    except OSError as exc:
        raise JobInputError(f"cannot use the output folder {out_dir}: "
                            f"{exc.strerror or exc}") from None
    holder = out_dir / f"{LOCK_NAME}.json"
    try:
        atomic_write_json(holder, {"pid": os.getpid(), "config": str(config),
                                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime())})
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def foreign_loras(out_dir: Path, name: str, suffixes: Sequence[str] = ("",)) -> list[Path]:
    """LoRA-named files in `out_dir` that aitk did not write (it would overwrite them).
    `suffixes`: the model's per-file suffixes (`_high_noise`, ... for multi-expert)."""
    if not out_dir.is_dir():
        return []
    finals = {f"{name}{s}.safetensors" for s in suffixes}
    return [p for p in out_dir.iterdir() if (p.name in finals
                                             or _step_lora_step(p, name, suffixes) is not None)
            and not lora_is_ours(p)]


def write_run_config(path: Path, loaded: LoadedConfig, say: Callable[[str], None]) -> None:
    """config.yaml: ours (first line CONFIG_HEADER, or exactly this config as an earlier
    aitk wrote it) is rewritten; anyone else's is left alone."""
    if path.exists() or path.is_symlink():
        try:
            with open(path, "rb") as fh:
                head = fh.read(1 << 20).decode("utf-8")
            import yaml

            ours = head.startswith(CONFIG_HEADER) or yaml.safe_load(head) == loaded.recorded
        except (OSError, ValueError, yaml.YAMLError):
            ours = False
        if not ours or path.is_symlink():
            say(f"{path} was not written by aitk; left as it is (the config as run is "
                "in the LoRA file's metadata)")
            return
    atomic_write_text(path, CONFIG_HEADER + dump_yaml(loaded.recorded))


def resume_point(ckpt_root: Path, say: Callable[[str], None]) -> ckpt.Checkpoint | None:
    """The newest valid checkpoint; None for a fresh start. When checkpoints exist but
    none validates, stop (exit 2) rather than start again from 0 and prune them all."""
    try:
        found = ckpt.find_resumable(ckpt_root, report=say)
    except ckpt.CorruptCheckpoint as exc:
        raise JobInputError(str(exc)) from None
    aside = ckpt.set_aside_earlier(ckpt_root)
    if found is None and aside:
        raise JobInputError(
            f"no checkpoint in {ckpt_root} validates; set aside (renamed, not deleted): "
            f"{', '.join(p.name for p in aside)}. To start again from step 0, move or "
            f"delete those folders; to keep training them, restore a good copy as step_...")
    return found


def usable_cache_dir(say: Callable[[str], None]) -> Path | None:
    """The cache folder, or None when it cannot be written (a read-only checkout): the
    caches then live in memory for this run. Never a reason to stop training."""
    folder = default_cache_dir(REPO_ROOT)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        say(f"cache folder {folder} is not writable ({exc.strerror or exc}); caches stay "
            "in memory for this run (set AITK_CACHE_DIR to a writable folder)")
        return None
    return folder


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
    """`model.create_if_missing`: build the arch's tiny random model on first use."""
    from aitk.models import registry

    path = Path(proc.model.name_or_path).expanduser()
    if not proc.model.create_if_missing or path.exists():
        return
    model_cls = registry.get_model_class(proc.model.arch)
    print(f"building a tiny random {proc.model.arch} model at {path} (create_if_missing)",
          file=sys.stderr)
    try:
        model_cls.build_tiny(path)
    except NotImplementedError:
        raise JobInputError(f"model.create_if_missing: the {proc.model.arch} arch has no "
                            "tiny random model to build; point name_or_path at a model"
                            ) from None


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


def scan_datasets(proc: ProcessConfig, divisibility: int, report: Callable[[str], None],
                  is_video: bool = False) -> list[Item]:
    """Every dataset's items. For a video arch (`is_video`) each dataset's frame settings
    apply; an image arch refuses num_frames above 1 (one line, exit 2)."""
    from aitk.data.video import ClipSpec

    items: list[Item] = []
    for i, ds in enumerate(proc.datasets):
        if ds.num_frames > 1 and not is_video:
            raise DatasetError(f"datasets[{i}].num_frames is "
                               f"{ds.num_frames}, but arch {proc.model.arch!r} trains on "
                               "images; set num_frames: 1 or use a video arch")
        clip = (ClipSpec(ds.num_frames, float(ds.fps), ds.shrink_video_to_frames)
                if is_video else None)
        found = scan_folder(Path(ds.folder_path).expanduser(), caption_ext=ds.caption_ext,
                            default_caption=ds.default_caption,
                            trigger_word=ds.trigger_word or proc.trigger_word,
                            resolutions=ds.resolutions, divisibility=divisibility,
                            caption_dropout_rate=ds.caption_dropout_rate,
                            num_repeats=ds.num_repeats, clip=clip, report=report)
        items += controls.pair_controls(
            found, [Path(p).expanduser() for p in ds.control_paths], report)
    controls.check_same_count(items)
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
def model_identity(model: Any, cache_dir: Path | None) -> str:
    """The model's cache-key fingerprint. File digests are remembered in the cache folder
    (by path, size and mtime), so a multi-GB model is hashed once, not at every start."""
    return model.identity(digest_cache=cache_dir / "model_digests.json" if cache_dir
                          else None)


def fill_shared(fill: Callable[..., Any], entries: Sequence[Any], world: distributed.World,
                shared: bool, stop: StopFlag) -> None:
    """Fill a cache. On a disk cache shared by several ranks, each rank first computes
    its own share (every W-th entry), so no two ranks write one entry; after a barrier
    the full pass only reads what the others wrote."""
    if shared and world.distributed:
        fill(list(dict.fromkeys(entries))[world.rank::world.size], stop=stop.check)
        distributed.barrier(world)
    fill(entries, stop=stop.check)


def cached_latents(proc: ProcessConfig, model: Any, items: list[Item], stop: StopFlag,
                   say: Callable[[str], None], stream: TextIO, cache_dir: Path | None,
                   world: distributed.World = distributed.SINGLE
                   ) -> Callable[[Sequence[Item]], torch.Tensor] | None:
    """Encode every image once (memory, and disk with `cache_latents_to_disk`); None
    when no dataset asks for caching: the loop then encodes each batch."""
    if not any(ds.cache_latents or ds.cache_latents_to_disk for ds in proc.datasets):
        return None
    to_disk = any(ds.cache_latents_to_disk for ds in proc.datasets)
    folder = cache_dir / "latents" if to_disk and cache_dir else None
    cache = LatentCache(model.encode_images, model_identity(model, cache_dir),
                        model.latent_space_version, folder, report=say)
    print(f"caching latents for {len(set(items))} image sizes", file=stream, flush=True)
    fill_shared(cache.fill, items, world, folder is not None, stop)
    return cache.get


def text_embeddings(proc: ProcessConfig, model: Any, items: list[Item],
                    samples: list[Any], stop: StopFlag, say: Callable[[str], None],
                    cache_dir: Path | None, world: distributed.World = distributed.SINGLE
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
    cache = TextEmbedCache(model.encode_prompts, model_identity(model, cache_dir),
                           model.text_embedding_space_version,
                           cache_dir / "text_embeds" if cache_dir else None, report=say)
    fill_shared(cache.fill, list(dict.fromkeys(captions)), world, cache_dir is not None,
                stop)
    model.unload_text_encoder()  # every caption is cached: free its memory
    return cache.get, cache.mapping()


def control_text_embeddings(proc: ProcessConfig, model: Any, items: list[Item],
                            samples: list[Any], stop: StopFlag, say: Callable[[str], None],
                            cache_dir: Path | None,
                            world: distributed.World = distributed.SINGLE
                            ) -> tuple[controls.ControlEmbeds, dict[str, Any] | None]:
    """`text_embeddings` for a model whose embeddings read the control images
    (aitk.data.controls): cache entries are keyed by caption and control content, and the
    preview prompts by `prompt_key(text, ctrl_imgs)`."""
    def encode(captions: list[str], images: list[torch.Tensor]) -> Any:
        with torch.no_grad():
            return model.get_prompt_embeds(captions, control_images=images).detach()

    tr = proc.train
    if not (tr.cache_text_embeddings or tr.unload_text_encoder
            or any(ds.cache_text_embeddings for ds in proc.datasets)):
        return (lambda captions, batch_items, images: encode(captions, images)), None
    cache = controls.ControlTextEmbedCache(
        encode, model_identity(model, cache_dir), model.text_embedding_space_version,
        cache_dir / "text_embeds" if cache_dir else None, report=say)
    fill_shared(cache.fill, controls.caption_pairs(items), world, cache_dir is not None, stop)
    sample_embeds = {}
    for c in samples:
        images = controls.load_sample_controls(c.ctrl_imgs)
        for text in (c.prompt, c.negative_prompt):
            sample_embeds[controls.prompt_key(text, c.ctrl_imgs)] = encode([text], images)
    model.unload_text_encoder()  # every caption is cached: free its memory
    return (lambda captions, batch_items, images: cache.get(captions, batch_items)), \
        sample_embeds


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
        "aitk_info": json.dumps(provenance.collect()),  # same block as `manager info`
    }


def step_lora_name(name: str, step: int) -> str:
    return f"{name}_{step:09d}.safetensors"


def _step_lora_step(path: Path, name: str, suffixes: Sequence[str] = ("",)) -> int | None:
    # Not glob(): a name like "lora[v2]" would read as a pattern and match nothing.
    prefix = f"{name}_"
    if path.suffix != ".safetensors" or not path.stem.startswith(prefix):
        return None
    rest = path.stem[len(prefix):]
    for suffix in suffixes:
        digits = rest[:len(rest) - len(suffix)] if suffix else rest
        if rest.endswith(suffix) and len(digits) == 9 and digits.isdigit():
            return int(digits)
    return None


def prune_step_loras(out_dir: Path, name: str, keep: int,
                     suffixes: Sequence[str] = ("",)) -> None:
    """Keep the step LoRAs of the newest `keep` steps (every file of a step, one per
    suffix); only files aitk wrote count or are deleted."""
    found = {p: _step_lora_step(p, name, suffixes) for p in out_dir.iterdir()}
    found = {p: step for p, step in found.items() if step is not None
             and not p.is_symlink() and lora_is_ours(p)}
    old_steps = sorted(set(found.values()))[:-keep]
    for path, step in found.items():
        if step in old_steps:
            path.unlink(missing_ok=True)


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
                stream: TextIO, world: distributed.World = distributed.SINGLE,
                status: StatusFile | None = None) -> Outcome:
    """One process of a job. Under torchrun every rank runs this; rank 0 alone writes
    (outputs, checkpoints, samples, logs) and holds the output folder's lock, and the
    others train their shard."""
    out_dir = Path(proc.training_folder).expanduser() / loaded.name
    if not world.is_main:
        return train_process(loaded, proc, out_dir, stop, stream, world, status)
    with output_lock(out_dir, loaded.source):
        return train_process(loaded, proc, out_dir, stop, stream, world, status)


def train_process(loaded: LoadedConfig, proc: ProcessConfig, out_dir: Path, stop: StopFlag,
                  stream: TextIO, world: distributed.World,
                  status: StatusFile | None = None) -> Outcome:
    from aitk.run.sampling import image_configs, write_samples

    main = world.is_main
    if not main:
        stream = io.StringIO()  # one console voice: rank 0's
    say = Reporter(stream)
    name = loaded.name
    foreign = foreign_loras(out_dir, name) if main else []
    if foreign:
        raise JobInputError(f"{', '.join(str(p) for p in foreign)} "
                            f"{'was' if len(foreign) == 1 else 'were'} not written by aitk "
                            "and would be overwritten; move them away or give this run "
                            "another name")
    device = distributed.device_for(world, pick_device(proc.device))
    distributed.init(world, device)
    quiet_library_progress()
    if main:
        ensure_example_model(proc)
    distributed.barrier(world)
    model = load_model(proc, device, report=say)
    model.configure_training(proc.train)
    suffixes = model.lora_file_suffixes()
    foreign = foreign_loras(out_dir, name, suffixes) if main and suffixes != ("",) else []
    if foreign:  # per-expert file names, known once the model is loaded
        raise JobInputError(f"{', '.join(str(p) for p in foreign)} "
                            f"{'was' if len(foreign) == 1 else 'were'} not written by aitk "
                            "and would be overwritten; move them away or give this run "
                            "another name")
    stop.check()

    items = scan_datasets(proc, model.get_bucket_divisibility(), say,
                          getattr(model, "is_video", False))
    if len(items[0].controls) > 1 and not model.has_multiple_control_images:
        say(f"{proc.model.arch} takes one control image: only the first control folder "
            "is used")
    tr = proc.train
    samples = [] if tr.disable_sampling else image_configs(proc.sample, proc.trigger_word)
    status = status or StatusFile(None)
    status.phase("caching")
    cache_dir = usable_cache_dir(say)
    latents = cached_latents(proc, model, items, stop, say, stream, cache_dir, world)
    control_embeds = None
    if model.encode_control_in_text_embeddings and items[0].controls:
        control_embeds, sample_embeds = control_text_embeddings(
            proc, model, items, samples, stop, say, cache_dir, world)
        embeds = model.get_prompt_embeds  # unused: every item has its controls
    else:
        embeds, sample_embeds = text_embeddings(proc, model, items, samples, stop, say,
                                                cache_dir, world)

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
    data = BatchSource(items, tr.batch_size, tr.seed, latents, model.encode_images, embeds,
                       control_embeds)

    ckpt_root = out_dir / "checkpoints"
    if main:  # rank 0 cleans up and sets invalid checkpoints aside; then all read
        ckpt.clean_stale(ckpt_root)
        found = resume_point(ckpt_root, say)
    distributed.barrier(world)
    if not main:
        found = resume_point(ckpt_root, say)
    start = 0
    if found is not None:
        restore(found, network, optimizer, data)
        start = found.step
        print(f"resuming {name} from step {start} ({found.path})", file=stream, flush=True)
    if main:
        write_run_config(out_dir / "config.yaml", loaded, say)
    ranks = f" x {world.size} processes" if world.distributed else ""
    print(f"training {name}: {len({i.path for i in items})} images ({len(items)} items with "
          f"resolutions and repeats), {tr.steps} steps on {device.type}{ranks}; outputs in "
          f"{out_dir}", file=stream, flush=True)
    trained.train()  # adapter dropout active; previews switch to eval and back
    status.phase("training", step=start, total_steps=tr.steps)
    metrics = Metrics(out_dir / "loss_log.jsonl" if main else None, tr.steps, start, name,
                      stream=stream, status=status)
    save_dtype = SAVE_DTYPES[proc.save.dtype]

    def lora_path(step: int) -> Path:
        return out_dir / (f"{name}.safetensors" if step >= tr.steps
                          else step_lora_name(name, step))

    def save(step: int) -> None:
        if not main:
            return
        status.phase("saving")
        meta = lora_metadata(loaded, proc, step, data.epoch)
        files = checkpoint_files(network, optimizer, data, step, schedule, loaded)
        # The checkpoint, then the LoRA (at most the adapter's full-precision size).
        check_free_space(out_dir, sum(map(len, files.values()))
                         + len(files["adapter.safetensors"]))
        ckpt.save_checkpoint(ckpt_root, step, files)
        lora = lora_path(step)
        network.save_file(lora, meta, dtype=save_dtype)  # atomic, public keys
        ckpt.prune(ckpt_root, proc.save.max_step_saves_to_keep)
        prune_step_loras(out_dir, name, proc.save.max_step_saves_to_keep, suffixes)
        names = ", ".join(p.name for p in network.file_paths(lora))
        metrics.message(f"saved {names} and checkpoint {ckpt.dir_name(step)}")
        status.phase("training")

    def sample(step: int) -> None:
        if not main:
            return
        status.phase("sampling")
        paths = write_samples(model, samples, out_dir / "samples", step, proc.sample.format,
                              sample_embeds, say=metrics.message)
        metrics.message(f"wrote {len(paths)} samples for step {step}")
        status.phase("training")

    if main and start > 0 and not all(p.exists() for p in network.file_paths(lora_path(start))):
        # A save cut between its checkpoint and its LoRA file (second Ctrl+C, crash):
        # the checkpoint holds the same weights, and the loop will not save this step.
        network.save_file(lora_path(start), lora_metadata(loaded, proc, start, data.epoch),
                          dtype=save_dtype)
        metrics.message(f"wrote {lora_path(start).name} (missing after an interrupted save)")

    settings = LoopSettings(
        total_steps=tr.steps, accumulation=tr.accumulation, max_grad_norm=tr.max_grad_norm,
        save_every=proc.save.save_every,
        sample_every=proc.sample.sample_every if samples else None,
        sample_first=not tr.skip_first_sample, seed=tr.seed,
        # Reading a loss syncs an accelerator; on a CPU it costs nothing.
        log_every=1 if device.type == "cpu" else 10, world=world)
    try:
        if start >= tr.steps:
            metrics.message(f"{name} already finished at step {start}")
        outcome = train(Run(model=model, params=params, optimizer=optimizer,
                            schedule=schedule, settings=settings,
                            next_batch=lambda: data.next_for(world.rank, world.size),
                            save=save, sample=sample, log=metrics.log,
                            # Every rank stops at the same step when any was asked to.
                            stop_requested=lambda: distributed.agree(world, stop.requested,
                                                                     device)), start)
        # Leave together: a rank that tore its process group down while rank 0 was
        # still saving could abort in gloo's threads ("terminate called ...").
        distributed.barrier(world)
        return outcome
    finally:
        metrics.close()


# ---- the job --------------------------------------------------------------------------
KNOWN_ERRORS: dict[type[BaseException], int] = {
    ConfigError: EXIT_CONFIG, JobInputError: EXIT_CONFIG, DatasetError: EXIT_CONFIG,
    OptimizerUnavailable: EXIT_CONFIG, NonFiniteLoss: EXIT_FAILED,
    distributed.DistributedError: EXIT_CONFIG,
}


def _known_error_code(exc: BaseException) -> int | None:
    if is_disk_full(exc):
        return EXIT_FAILED
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
    stream = LenientStream(stream or sys.stderr)  # type: ignore[assignment]
    first = loaded.job.config.process[0]
    # Under torchrun rank 0 alone writes the status file (aitk.run.distributed).
    writes = os.environ.get("RANK", "0") == "0"
    status = StatusFile(status_path(Path(first.training_folder).expanduser() / loaded.name)
                        if writes else None, loaded.name)
    status.phase("loading")
    code = _run_job(loaded, stream, status)
    status.finish(code, error=status.fields["error"], problems=status.fields["errors"])
    return code


def _run_job(loaded: LoadedConfig, stream: TextIO, status: StatusFile) -> int:
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=stream)
    stop = StopFlag(say=lambda m: print(m, file=stream, flush=True))
    world = distributed.SINGLE
    try:
        world = distributed.World.from_env()
        with stop.installed(), registered(loaded.name, loaded.source):
            for proc in loaded.job.config.process:
                if run_process(loaded, proc, stop, stream, world, status) is Outcome.STOPPED:
                    if world.is_main:
                        print(f"stopped; run the same config again to resume "
                              f"{loaded.name}", file=stream)
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
        if is_disk_full(exc):  # one line: what is full, how much, what to do
            where = exc if isinstance(exc, DiskFull) else \
                f"not enough disk space ({exc.strerror}: {exc.filename})"
            print(f"error: {where}; the last saved checkpoint is kept: free some space, "
                  f"then run the same config again to resume {loaded.name}", file=stream)
            return code
        print(f"error: {exc}", file=stream)
        status.fields["error"] = str(exc)
        if isinstance(exc, ConfigError):
            status.fields["errors"] = exc.problems
        return code
    finally:
        distributed.shutdown(world)
