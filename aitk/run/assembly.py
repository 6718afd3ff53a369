"""Assembling a process: the device, the model, the datasets and the adapter the loop
trains. Each step is a plain function of the process config; aitk.run.process calls
them in order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import torch

from aitk.config.schema import ModelConfig, TrainingProcess
from aitk.data import controls
from aitk.data.batches import BatchSource, DatasetRules, NoImages
from aitk.data.captions import CaptionRules
from aitk.data.dataset import Item, scan_folder
from aitk.errors import AdapterError, AdapterFileError, DatasetError, DeviceUnavailable, ModelError
from aitk.run.caches import live_prompt_dropout
from aitk.run.ema import AdapterEMA
from aitk.run.optim import Schedule, build_optimizer, schedule_from_config

TRAIN_DTYPES = {"fp32": torch.float32, "float32": torch.float32,
                "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def pick_device(requested: str | None) -> torch.device:
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"device {requested!r} was asked for but CUDA is not "
                                "available here; set `device: cpu` (or remove `device`)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailable(f"device {requested!r} was asked for but MPS is not "
                                "available")
    return device


def ensure_example_model(model: ModelConfig) -> None:
    """`model.create_if_missing`: build the arch's tiny random model on first use."""
    from aitk.models import registry

    path = Path(model.name_or_path).expanduser()
    if not model.create_if_missing or path.exists():
        return
    model_cls = registry.get_model_class(model.arch)
    print(f"building a tiny random {model.arch} model at {path} (create_if_missing)",
          file=sys.stderr)
    try:
        model_cls.build_tiny(path)
    except NotImplementedError:
        raise ModelError(f"model.create_if_missing: the {model.arch} arch has no "
                         "tiny random model to build; point name_or_path at a model"
                         ) from None


def quiet_library_progress() -> None:
    """Loading a local folder is quick; per-file bars would bury the training output."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()


def load_model(proc: TrainingProcess, device: torch.device,
               report: Callable[[str], None] | None = None) -> Any:
    from aitk.models import registry

    # `report` shows broken extensions even when the requested arch loads fine.
    model_cls = registry.get_model_class(proc.model.arch, report=report)
    model = model_cls(proc.model, device=device, dtype=TRAIN_DTYPES[proc.train.dtype])
    model.load_model()
    if proc.model.lora_path:  # fused into the frozen base before the adapter attaches
        from aitk.models.fused_lora import fuse_lora

        fuse_lora(model.get_model_to_train(), proc.model.lora_path, proc.model.arch,
                  model.convert_lora_weights_before_load, proc.model.quantize)
    return model


def create_network(model: Any, proc: TrainingProcess) -> Any:
    from aitk.adapters import AdapterNetwork

    net = proc.network
    # The adapter reads upstream's names; hand it the resolved rank/alpha aliases.
    spec = SimpleNamespace(type=net.type, linear=net.dim, linear_alpha=net.scale_alpha,
                           dropout=net.dropout or 0.0, lokr_factor=net.lokr_factor,
                           conv=net.conv, conv_alpha=net.conv_alpha,
                           network_kwargs=net.network_kwargs.model_dump(exclude_none=True),
                           train_text_encoder=proc.train.train_text_encoder)
    network = AdapterNetwork.attach(model, spec)
    start_from_file(network, net.pretrained_lora_path)
    return network


def start_from_file(network: Any, path: str | None) -> None:
    """`network.pretrained_lora_path`: the adapter's weights from a LoRA file (its alpha
    rescaled to the network's, aitk.adapters.network.load_file); a resume overwrites
    them with the checkpoint's."""
    if path is None:
        return
    file = Path(path).expanduser()
    if not file.is_file():
        raise AdapterFileError(f"network.pretrained_lora_path: {file} is not a file (the "
                               "LoRA the adapter starts from)")
    try:
        network.load_file(file)
    except AdapterError as exc:  # one line that names the key that brought the file
        raise AdapterFileError(f"network.pretrained_lora_path: {exc}") from None


def parameter_groups(network: Any, proc: TrainingProcess) -> list[dict[str, Any]]:
    """The optimizer's groups: the denoiser's adapter (or weights) at `unet_lr`, a text
    encoder's at `text_encoder_lr`, each unset one at `lr`; as scales of `lr`, so all
    follow the one LR schedule."""
    tr = proc.train
    encoders = {id(p) for p in network.text_encoder_parameters()}
    groups: list[dict[str, Any]] = [
        {"params": [p for p in network.trainable_parameters() if id(p) not in encoders]}]
    if tr.unet_lr is not None:
        groups[0]["lr_scale"] = tr.unet_lr / tr.lr
    if encoders:
        rate = tr.text_encoder_lr if tr.text_encoder_lr is not None else tr.lr
        groups.append({"params": network.text_encoder_parameters(),
                       "lr_scale": rate / tr.lr})
    return groups


def enable_gradient_checkpointing(module: torch.nn.Module) -> None:
    if hasattr(module, "enable_gradient_checkpointing"):
        module.enable_gradient_checkpointing()
    else:
        module.gradient_checkpointing = True


def scan_datasets(proc: TrainingProcess, divisibility: int, report: Callable[[str], None],
                  is_video: bool = False, audio: bool = False) -> list[Item]:
    """Every dataset's items, each tagged with its dataset's index (and the mirrored
    copies flip_x/flip_y ask for). For a video arch (`is_video`) each dataset's frame
    settings apply; an image arch refuses num_frames above 1 (one line, exit 2). With
    `audio` (the arch trains sound) a `do_audio` dataset's videos carry their
    soundtrack's span; without it `do_audio` is said to be ignored."""
    from aitk.data.video import ClipSpec

    items: list[Item] = []
    for i, ds in enumerate(proc.datasets):
        if ds.num_frames > 1 and not is_video:
            raise DatasetError(f"datasets[{i}].num_frames is "
                               f"{ds.num_frames}, but arch {proc.model.arch!r} trains on "
                               "images; set num_frames: 1 or use a video arch")
        if ds.auto_frame_count and not is_video:
            raise DatasetError(f"datasets[{i}].auto_frame_count is set, but arch "
                               f"{proc.model.arch!r} trains on images; remove it or use a "
                               "video arch")
        if ds.augments and is_video:
            raise DatasetError(f"datasets[{i}].augments: augments apply to images, not "
                               f"videos (as upstream); remove them for arch "
                               f"{proc.model.arch!r}")
        if ds.do_audio and not audio:
            report(f"datasets[{i}].do_audio: arch {proc.model.arch!r} trains no sound; "
                   "its videos train without their audio")
        clip = (ClipSpec(ds.num_frames, float(ds.fps), ds.shrink_video_to_frames,
                         ds.auto_frame_count, ds.trim_auto_frame_count_tail,
                         audio=ds.do_audio and audio, audio_normalize=ds.audio_normalize,
                         audio_preserve_pitch=ds.audio_preserve_pitch)
                if is_video else None)
        found = scan_folder(Path(ds.folder_path).expanduser(), caption_ext=ds.caption_ext,
                            default_caption=ds.default_caption,
                            trigger_word=ds.trigger_word or proc.trigger_word,
                            resolutions=ds.resolutions, divisibility=divisibility,
                            caption_dropout_rate=ds.caption_dropout_rate,
                            num_repeats=ds.num_repeats, clip=clip, report=report,
                            add_trigger=not ds.is_reg,
                            replacements=ds.replacement_pairs, scale=ds.scale,
                            square_crop=ds.square_crop)
        found = [dataclasses.replace(item, dataset=i) for item in found]
        items += mirrored(controls.pair_controls(
            found, [Path(p).expanduser() for p in ds.control_paths], report),
            ds.flip_x, ds.flip_y)
    controls.check_same_count(items)
    return items


def mirrored(items: list[Item], flip_x: bool, flip_y: bool) -> list[Item]:
    """The items plus a left-right copy of each (flip_x), then a top-bottom copy of all
    of those (flip_y), as upstream extends a dataset."""
    if flip_x:
        items = items + [dataclasses.replace(i, flip_x=True) for i in items]
    if flip_y:
        items = items + [dataclasses.replace(i, flip_y=True) for i in items]
    return items


def random_triggers(value: list[str] | str, where: str) -> tuple[str, ...]:
    """`random_triggers`: a list, or (upstream) a text file with one trigger a line."""
    if isinstance(value, list):
        return tuple(t.strip() for t in value if t.strip())
    from aitk.data.dataset import MAX_CAPTION_BYTES, open_input

    path = Path(value).expanduser()
    try:
        with open_input(path, MAX_CAPTION_BYTES) as fh:
            text = fh.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{where}.random_triggers: cannot read {path} ({exc}); give a "
                           "list or a UTF-8 text file with one trigger a line") from None
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def dataset_rules(proc: TrainingProcess, vary_captions: bool) -> list[DatasetRules]:
    """Each dataset's per-draw settings (aitk.data.batches.DatasetRules). Captions vary
    only when `vary_captions` (their text embeddings are not cached once per caption)."""
    out = []
    for i, ds in enumerate(proc.datasets):
        captions = CaptionRules(
            shuffle_tokens=ds.shuffle_tokens, keep_tokens=ds.keep_tokens,
            token_dropout_rate=ds.token_dropout_rate,
            random_triggers=random_triggers(ds.random_triggers, f"datasets[{i}]"),
            random_triggers_max=ds.random_triggers_max,
            trigger=ds.trigger_word or proc.trigger_word) if vary_captions else CaptionRules()
        weight = ds.loss_multiplier * (proc.train.reg_weight if ds.is_reg else 1.0)
        out.append(DatasetRules(batch_size=ds.batch_size or proc.train.batch_size,
                                captions=captions, augments=tuple(ds.augments),
                                random_crop=ds.random_crop or ds.random_scale,
                                random_scale=ds.random_scale,
                                is_reg=ds.is_reg, prior_reg=ds.prior_reg,
                                network_weight=ds.network_weight,
                                loss_weight=weight))
    return out


class Reporter:
    """Each distinct message once (unreadable images, missing captions)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            print(f"warning: {message}", file=self.stream, flush=True)


@dataclass
class Trainable:
    """What the loop updates and a checkpoint holds: the adapter on the model (or, for a
    full fine-tune, aitk.run.finetune.FullWeights), its optimizer and LR schedule, and
    the batch source (its order is resumed too)."""

    network: Any
    module: torch.nn.Module  # the denoiser that trains (see network.trained_parts())
    params: list[torch.nn.Parameter]  # every trained parameter: optimizer, clip, average
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    data: BatchSource | NoImages
    ema: AdapterEMA | None = None  # train.ema_config: what is saved and previewed

    @contextlib.contextmanager
    def published(self) -> Iterator[None]:
        """The weights a LoRA file, a preview and the validation loss show: the EMA's
        when it is on, else the trained ones."""
        with self.ema.applied() if self.ema is not None else contextlib.nullcontext():
            yield

    def extra_state(self) -> dict[str, Any]:
        """What a checkpoint keeps besides adapter, optimizer, RNG and data order."""
        return {} if self.ema is None else {"ema.pt": self.ema.state_dict()}

    def load_extra_state(self, found: Callable[[str], Any | None],
                         say: Callable[[str], None]) -> None:
        """Restore `extra_state` from a checkpoint (`found(name)`: its object or None)."""
        if self.ema is not None:
            state = found("ema.pt")
            if state is None:  # EMA switched on for a run that trained without it
                say("the checkpoint has no EMA of the adapter; the average starts from "
                    "the resumed weights")
                self.ema = self.ema.restarted()
            else:
                self.ema.load_state_dict(state)


def attach_adapter(proc: TrainingProcess, model: Any, items: list[Item],
                   latents: Callable[[Sequence[Item]], torch.Tensor] | None,
                   embeds: Callable[..., Any],
                   control_embeds: controls.ControlEmbeds | None,
                   vary_captions: bool = True,
                   audio: Callable[[Item], torch.Tensor | None] | None = None) -> Trainable:
    """The adapter (seeded), gradient checkpointing, the optimizer and schedule, and the
    batch source over the encoded inputs."""
    tr = proc.train
    torch.manual_seed(tr.seed)  # adapter init; a resume overwrites both
    network = create_network(model, proc)
    module = model.get_model_to_train()
    if tr.gradient_checkpointing:
        enable_gradient_checkpointing(module)
    params = list(network.trainable_parameters())
    return trainable_over(proc, model, network, module, params, items, latents, embeds,
                          control_embeds, vary_captions, audio)


def trainable_over(proc: TrainingProcess, model: Any, network: Any,
                   module: torch.nn.Module, params: list[torch.nn.Parameter],
                   items: list[Item], latents: Callable[[Sequence[Item]], torch.Tensor] | None,
                   embeds: Callable[..., Any],
                   control_embeds: controls.ControlEmbeds | None,
                   vary_captions: bool = True,
                   audio: Callable[[Item], torch.Tensor | None] | None = None) -> Trainable:
    """The optimizer and LR schedule over `params`, and the batch source (none for a
    process without datasets: a slider makes its own latents)."""
    tr = proc.train
    optimizer = build_optimizer(tr.optimizer, parameter_groups(network, proc), tr.lr,
                                tr.optimizer_params)
    schedule = schedule_from_config(tr)
    data = BatchSource(items, tr.batch_size, tr.seed, latents, model.encode_images, embeds,
                       control_embeds, dataset_rules(proc, vary_captions),
                       tr.accumulation, audio, live_prompt_dropout(proc),
                       getattr(model, "prompt_dropout_encoders", 1)) if items else NoImages()
    settings = tr.ema_config
    ema = AdapterEMA(params, settings.ema_decay, settings.use_feedback,
                     settings.param_multiplier) if settings.use_ema else None
    return Trainable(network, module, params, optimizer, schedule, data, ema)
