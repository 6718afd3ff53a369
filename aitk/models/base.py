"""BaseModel: the contract between the trainer and a model architecture.

Registering an arch: a subclass sets `arch = "name"` (matched against `model.arch` in the
job config) and `use_old_lokr_format = False`. A built-in arch is a folder
`aitk/models/<folder>/` whose torch-free `arch.py` describes it (`DESCRIPTIONS`, see
aitk.models.description: names, the class as "module:Class", size multiple, schedule,
typed `model_kwargs`, LoRA layout, part sizes), plus the folder's name in
`aitk.models.builtin.ARCH_FOLDERS`. An extension lists its classes in a module-level
`AI_TOOLKIT_MODELS` in a package of its own under `extensions/` (see extensions/README.md
and aitk.models.registry), each optionally with a `description` class attribute.
`python -m aitk models` shows what was found. `aitk/models/example/` is a complete,
small implementation to copy from.

The trainer calls these hooks in this order:

1. Load: `load_model()` builds the transformer, text encoder(s), tokenizer(s), VAE and
   scheduler from `model_config.name_or_path` and stores them on self (`self.model`,
   alias `transformer` / `unet`; `self.text_encoder`, `self.tokenizer`, `self.vae`,
   `self.noise_scheduler`), frozen (`requires_grad_(False)`) and on `self.device`
   (`place_loaded`: with `model_config.low_vram` the idle parts wait on the CPU and
   visit the device inside `with self.on_device(part):`).
   Apply `model_config.quantize` / `quantize_te` here (`quantize_transformer`,
   `quantize_text_encoder`, over aitk.models.quantize) and read extra knobs from
   `self.model_kwargs` (`model.model_kwargs` checked against the description's typed
   knobs; an unknown key is a ModelKwargsError naming the valid ones).
   aitk.models.loading loads each part from a folder or a hub id (`load_part`) with
   one-line errors. Raise `ModelLoadError` with the path and what is missing. With
   `train.gradient_checkpointing` the trainer then calls
   `self.model.enable_gradient_checkpointing()`.
2. Caching (optional, before training): `encode_images(pixels)` per image (latent
   cache) and `get_prompt_embeds([caption])` per caption (text-embed cache, one
   `AdvancedPromptEmbeds.save` file each). Cache keys include `identity()` and the
   `latent_space_version` / `text_embedding_space_version` properties: bump those when
   what the encoders produce changes. With text embeddings cached the trainer embeds
   the sample prompts with `encode_prompts()` and calls `unload_text_encoder()`.
3. Train step: `begin_micro_step(step * accumulation + micro)` (models that train
   parts by turns pick one; nothing by default) -> clean latents (cache or
   `encode_images`) -> noise and timesteps sampled -> `add_noise(clean, noise, t)` ->
   `condition_noisy_latents(noisy, batch)` (control or reference conditioning;
   identity by default) ->
   `get_noise_prediction(latent_model_input, timestep, text_embeddings, batch=batch)`
   under autograd -> MSE in float32 (weighted per item when the schedule says so)
   against `get_loss_target(noise=..., batch=..., timesteps=t)`, plus `side_loss()`
   (None by default) right after that prediction: the weighted loss of a stream the
   model predicted besides the latents (LTX-2's audio from `batch.audio_latents`, which
   `encode_audio` made from the PCM `audio_format()` asks for). Noise, timesteps,
   `add_noise`, the target and the weights come from `self.training_schedule`, which the
   trainer builds once after loading with `configure_training(train_config)` through
   `make_training_schedule(settings)`: flow matching without a shift by default
   (aitk.diffusion.flow_matching); override it for a timestep shift (Flux, Qwen-Image) or DDPM
   (aitk.diffusion.ddpm, SDXL). `self.train_config` then holds the job's `train:` section for
   model-specific knobs (e.g. Flux's guidance `cfg_scale`).
   LoRA/LoKr (aitk.adapters) attach to the nn.Linear layers of
   `get_model_to_train()` whose path starts with one of `lora_block_prefixes`; with
   `train.train_text_encoder` also to those of each part `text_encoder_parts()` names
   under `text_encoder_lora_prefixes` (the network then calls
   `train_text_encoders()`, and `get_prompt_embeds` must run under
   `self.text_encoder_grad()` so the embeddings carry the LoRA's gradients).
4. Previews: `generate_images(configs, prompt_embeds=None)` (implemented here) embeds
   each distinct prompt once with `get_prompt_embeds()`, calls
   `get_generation_pipeline()` once and `generate_single_image(pipeline, config,
   conditional_embeds, unconditional_embeds, generator)` per config, under
   `torch.no_grad()` in eval mode, with a CPU generator seeded from `config.seed`.
   The pipeline receives embeds only, never text.
5. Saving: a full fine-tune (and a LoRA merged into the model) saves the parts
   `denoiser_parts()` names (subfolder -> module: `transformer` by default, per
   `denoiser_subfolders`) plus, with `train.train_text_encoder`, `text_encoder_parts()`
   (trained as the text-encoder LoRA trains them, through `train_text_encoders()`),
   through aitk.run.model_files (`save_model(path)`
   writes a complete diffusers folder). LoRA files are written by
   aitk.adapters.AdapterNetwork, which maps keys through
   `convert_lora_weights_before_save/load()` (public keys with the `diffusion_model.`
   prefix; see aitk.adapters.keys), then splits them into one file per
   `lora_file_suffixes()` entry with `split_lora_file()` (one file by default; one per
   expert for Wan 2.2 14B) and joins them back on load with `join_lora_files()`; after
   writing it calls `on_lora_file_saved(path, network)`.

Conventions (keep them exactly):
- Pixels (B, 3, H, W) in [-1, 1]; control tensors arrive in [0, 1] (x * 2 - 1 before
  encoding).
- Latents (B, C, h, w); video latents (B, C, frames, h, w).
- Timesteps cross this API on 0..1000 where 1000 is pure noise; convert to the
  network's own convention inside `get_noise_prediction` (flip/rescale there).
- Flow matching: x_t = (1 - s) * clean + s * noise with s = t / 1000; the target is
  `noise - clean`.
- Prompt embeds are per item, 2-D (L, D), padded only at the model call
  (`AdvancedPromptEmbeds.pad`); keys that must keep their dtype go in
  `frozen_dtype_keys`.
- Gradient checkpointing uses `torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)` whenever the flag is set and `torch.is_grad_enabled()`, never
  gated on `self.training`.
- Quantized Linear layers take 2-D/3-D activations only: use `aitk.models.quantize.linear_nd`
  for a Linear applied over a 4-D tensor.
- Optional attention kernels (flash-attn) are imported under a guard, never at module
  top level; SDPA is the default (aitk.models.attention); `set_attention_backend()` on the
  network sets a per-module flag.
- `get_bucket_divisibility()` = vae scale factor * patch size: image sides are
  multiples of it.

Video archs set the class attribute `is_video = True` (default False). Their datasets then
take video files (aitk.data.video): pixels arrive as (B, 3, F, H, W) with F = the
dataset's `num_frames` (1 or 4k+1), an image being a 1-frame clip, so `encode_images`
takes 5-D pixels (and 4-D ones, as F = 1) and returns latents (B, C, f, h, w). An image
arch refuses `num_frames` above 1. A video arch's `generate_single_image` returns the
frames, a `list[PIL.Image]` (`config.num_frames` of them, played at `config.fps`), which
aitk.run.sampling writes as an animated WebP plus a frame strip; an arch that makes sound
returns them as a `VideoWithSound` (the list plus its waveform), written as an mp4 with
its soundtrack too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import ModelError
from aitk.models.description import (
    ArchDescription,
    ArchKwargs,
    PartRole,
    minimal_description,
)
from aitk.models.offload import visiting
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

if TYPE_CHECKING:
    from PIL import Image

    from aitk.data.batch import DataBatch


def parse_model_kwargs(description: ArchDescription, raw: Any) -> ArchKwargs:
    """The one place a model reads `model.model_kwargs` (a module-level function, so a
    test can watch which knobs an arch reads)."""
    return description.parse_model_kwargs(raw)


class ModelSettings(Protocol):
    """What a model reads from the job's `model:` section (aitk.config.schema.ModelConfig)."""

    arch: str
    name_or_path: str
    quantize: bool
    quantize_te: bool
    qtype: str
    qtype_te: str
    model_kwargs: dict[str, Any]


@dataclass
class GenerateImageConfig:
    """One preview image: fixed prompt and seed so previews are comparable across steps."""

    prompt: str
    width: int = 512
    height: int = 512
    seed: int = 42
    guidance_scale: float = 4.0
    sample_steps: int = 20
    negative_prompt: str = ""
    ctrl_img: str | None = None
    ctrl_imgs: list[str] = field(default_factory=list)  # every control, ctrl_img first
    num_frames: int = 1  # video archs: frames to generate
    fps: int = 16  # video archs: playback rate of the preview (upstream's sample default)
    output_path: str | None = None
    network_multiplier: float = 1.0  # the adapter's weight for this image (the caller's)


class VideoWithSound(list):
    """A video arch's preview with a soundtrack: the frames (a list, so everything that
    takes a preview's frames takes it) plus `audio`, (channels, samples) float PCM in
    [-1, 1] at `sample_rate`; aitk.run.sampling writes it as an mp4 too."""

    def __init__(self, frames: Iterable[Any], audio: Any, sample_rate: int) -> None:
        super().__init__(frames)
        self.audio = audio
        self.sample_rate = int(sample_rate)


class BaseModel:
    arch: ClassVar[str] = ""
    # An extension's description of its arch (built-ins are described in their folder's
    # arch.py and found by `arch`); see `describe()`.
    description: ClassVar[ArchDescription | None] = None
    # New archs use the new LoKr format; only legacy archs set this True.
    use_old_lokr_format: ClassVar[bool] = False
    encode_control_in_text_embeddings: ClassVar[bool] = False
    has_multiple_control_images: ClassVar[bool] = False
    # Video archs: datasets give clips (B, 3, F, H, W); previews are frame lists.
    is_video: ClassVar[bool] = False
    te_padding_side: ClassVar[str] = "right"
    # train.prompt_dropout_prob: draws per item, one per text encoder blanked on its own
    # (get_prompt_embeds_dropped); 1: the whole prompt.
    prompt_dropout_encoders: ClassVar[int] = 1
    # LoRA/LoKr attach to the nn.Linear layers whose path (inside get_model_to_train())
    # starts with one of these; override for networks that name their blocks otherwise.
    # LoCon (`network.conv`): where the Conv2d layers it trains are (UNet archs' ResNet
    # and resampling blocks); none for transformer archs.
    lora_conv_prefixes: ClassVar[tuple[str, ...]] = ()
    # `network.type: dora` needs a file layout that keeps each layer apart and names its
    # `dora_scale` (a layout that fuses layers, like FLUX.2's q/k/v, cannot carry a
    # per-layer magnitude); an arch opts in once its LoRA files are tested with it.
    supports_dora: ClassVar[bool] = False
    lora_block_prefixes: ClassVar[tuple[str, ...]] = (
        "blocks.", "transformer_blocks.", "single_transformer_blocks.", "layers.")
    # Text-encoder LoRA (`train.train_text_encoder`): the Linear layers under these paths
    # of each part text_encoder_parts() names; an arch with no such parts trains its
    # denoiser only.
    text_encoder_lora_prefixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model_config: ModelSettings, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.model_config = model_config
        # A typo in model_kwargs stops here (ModelKwargsError), before any weights load.
        parse_model_kwargs(self.describe(), getattr(model_config, "model_kwargs", None))
        self.device = torch.device(device)
        self.dtype = dtype
        self.model: nn.Module | None = None
        self.vae: nn.Module | None = None
        self.text_encoder: nn.Module | None = None
        self.tokenizer: Any = None
        self.noise_scheduler: Any = None
        self.train_config: Any = None  # the job's `train:` section, once configured
        self._training_schedule: NoiseSchedule | None = None
        # `do_guidance_loss`: the guidance a guidance-distilled model's embedding gets
        # during the passes of one step (per item), instead of `train.cfg_scale`.
        self.guidance_override: torch.Tensor | None = None
        # True once a text-encoder adapter trains (train_text_encoders): embeddings keep
        # their gradients, and the trained encoders stay on the device under low_vram.
        self.text_encoder_trains = False

    # `transformer` and `unet` are aliases of `model`, as model authors expect.
    @property
    def transformer(self) -> nn.Module | None:
        return self.model

    @transformer.setter
    def transformer(self, value: nn.Module | None) -> None:
        self.model = value

    @property
    def unet(self) -> nn.Module | None:
        return self.model

    @unet.setter
    def unet(self, value: nn.Module | None) -> None:
        self.model = value

    @classmethod
    def describe(cls) -> ArchDescription:
        """The arch's description: the class's own `description`, else the built-in one
        of its `arch` (aitk.models.catalog), else a minimal one (unknowns None)."""
        if cls.description is not None:
            return cls.description
        from aitk.models import catalog

        known = catalog.builtin_descriptions().get(cls.arch)
        return known if known is not None else minimal_description(cls)

    @property
    def model_kwargs(self) -> ArchKwargs:
        """`model.model_kwargs` as the arch's typed knobs (read at each use, so a test
        that edits the config after loading sees its value); raises ModelKwargsError
        naming each bad key and the valid ones."""
        raw = getattr(self.model_config, "model_kwargs", None)
        return parse_model_kwargs(self.describe(), raw)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        raise NotImplementedError

    # `model.low_vram`: idle parts (text encoders, a VAE, Wan 2.2's idle expert) wait on
    # the CPU and visit the device only while they work. Read from the config at each
    # use, so every arch (and a test that flips it after loading) sees one value.
    @property
    def low_vram(self) -> bool:
        return bool(getattr(self.model_config, "low_vram", False))

    @low_vram.setter
    def low_vram(self, value: bool) -> None:
        # Written through to the config: it stays the one place the flag lives.
        self.model_config.low_vram = bool(value)

    @property
    def idle_device(self) -> torch.device:
        """Where a part waits between uses: the CPU with `low_vram`, else the device."""
        return torch.device("cpu") if self.low_vram else self.device

    def place_loaded(self, working: Iterable[nn.Module],
                     idle: Iterable[nn.Module] = ()) -> None:
        """After loading: `working` parts (the denoiser) on the device, `idle` ones (text
        encoders, a VAE) on `idle_device`."""
        for module in working:
            module.to(self.device)
        for module in idle:
            module.to(self.idle_device)

    @contextlib.contextmanager
    def on_device(self, *modules: nn.Module | None) -> Iterator[None]:
        """With `low_vram`, the given parts (None: one the model lacks) visit the device
        inside the block and go back to the CPU after it, even on error; otherwise they
        already live on the device and nothing moves."""
        # A text encoder that trains stays put: its LoRA's gradients are computed on the
        # device after the forward pass, where a visit would have moved it away.
        resident = self.text_encoder_parts().values() if self.text_encoder_trains else ()
        with contextlib.ExitStack() as stack:
            if self.low_vram:
                for module in modules:
                    if module is not None and not any(module is r for r in resident):
                        stack.enter_context(visiting(module, self.device))
            yield

    # `model.quantize` / `quantize_te` while loading: each block is quantized as soon as
    # it is read (aitk.models.quantized_loading), so the float part never exists whole.
    def load_denoiser(self, cls: Any, name_or_path: str, subfolder: str,
                      exclude: Sequence[str] = (), **kwargs: Any) -> Any:
        """`load_part` of the denoiser, quantized to `model.qtype` while it loads when
        `model.quantize` is on (`exclude`: the layers the arch keeps in float)."""
        return self._load_maybe_quantized(cls, name_or_path, subfolder, "quantize",
                                          "qtype", exclude, **kwargs)

    def load_text_encoder(self, cls: Any, name_or_path: str, subfolder: str,
                          exclude: Sequence[str] = (), **kwargs: Any) -> Any:
        """`load_part` of a text encoder, quantized to `model.qtype_te` while it loads
        when `model.quantize_te` is on."""
        return self._load_maybe_quantized(cls, name_or_path, subfolder, "quantize_te",
                                          "qtype_te", exclude, **kwargs)

    def _load_maybe_quantized(self, cls: Any, name_or_path: str, subfolder: str,
                              switch: str, qtype_key: str, exclude: Sequence[str],
                              **kwargs: Any) -> Any:
        from aitk.models.loading import load_part

        cfg = self.model_config
        if not getattr(cfg, switch, False):
            return load_part(cls, name_or_path, subfolder, self.arch, **kwargs)
        from aitk.models.quantized_loading import load_part_quantized

        qtype = getattr(cfg, qtype_key, "qfloat8")
        adapter = self.recovery_adapter(subfolder) if switch == "quantize" else None
        if adapter is None:
            return load_part_quantized(cls, name_or_path, subfolder, self.arch, qtype,
                                       exclude=exclude, **kwargs)
        from aitk.models import recovery_adapter

        path, deltas = adapter
        module = load_part_quantized(
            cls, name_or_path, subfolder, self.arch, recovery_adapter.UNCOVERED_QTYPE,
            exclude=exclude, per_layer=dict.fromkeys(deltas, qtype), **kwargs)
        recovery_adapter.apply_adapter(module, deltas, path)
        module._aitk_recovery_adapter = str(path)
        return module

    # Where a transformer's layers sit in an accuracy recovery adapter file: upstream
    # writes one file per model; an arch whose experts it combines (Wan 2.2) overrides.
    def recovery_adapter_prefix(self, subfolder: str) -> str:
        return ""

    def recovery_adapter(self, subfolder: str = "transformer"
                         ) -> tuple[Path, dict[str, Any]] | None:
        """The accuracy recovery adapter's file and LoRA deltas for the denoiser part in
        `subfolder` (aitk.models.recovery_adapter), when one is configured."""
        cfg = self.model_config
        if not getattr(cfg, "quantize", False):
            return None
        from aitk.models.qtypes import parse_qtype

        spec = parse_qtype(getattr(cfg, "qtype", "qfloat8")).adapter or \
            getattr(cfg, "accuracy_recovery_adapter", None)
        if not spec:
            return None
        from aitk.models.recovery_adapter import read_adapter

        return read_adapter(spec, self.arch, self.recovery_adapter_prefix(subfolder))

    # `model.quantize` / `quantize_te` for load_model: each arch names the layers it
    # keeps in float (embedders, output layers: small and the most rounding-sensitive).
    def quantize_transformer(self, module: nn.Module, exclude: Sequence[str] = ()) -> None:
        """With `model.quantize`, the denoiser's Linear layers to `model.qtype`."""
        cfg = self.model_config
        if not getattr(cfg, "quantize", False):
            return
        from aitk.models.quantize import quantize_linear_layers

        qtype = getattr(cfg, "qtype", "qfloat8")
        adapter = None if hasattr(module, "_aitk_recovery_adapter") else \
            self.recovery_adapter()
        if adapter is None:  # (a part load_denoiser loaded is already quantized)
            quantize_linear_layers(module, qtype, exclude=exclude)
            return
        from aitk.models import recovery_adapter

        path, deltas = adapter
        quantize_linear_layers(module, recovery_adapter.UNCOVERED_QTYPE, exclude=exclude,
                               per_layer=dict.fromkeys(deltas, qtype))
        recovery_adapter.apply_adapter(module, deltas, path)
        module._aitk_recovery_adapter = str(path)

    def quantize_text_encoder(self, module: nn.Module, exclude: Sequence[str] = ()) -> None:
        """With `model.quantize_te`, a text encoder's Linear layers to `model.qtype_te`."""
        cfg = self.model_config
        if getattr(cfg, "quantize_te", False):
            from aitk.models.quantize import quantize_linear_layers

            quantize_linear_layers(module, getattr(cfg, "qtype_te", "qfloat8"),
                                   exclude=exclude)

    # ---- 2. encoders ---------------------------------------------------------------
    def prompt_token_limit(self, tokenizer: Any, cap: int) -> int:
        """Tokens a prompt keeps: `model_kwargs.max_sequence_length` when set, else the
        tokenizer's own limit capped at `cap` (transformers reports a huge number for a
        tokenizer that knows none)."""
        tokens = getattr(self.model_kwargs, "max_sequence_length", None)
        if tokens is not None:
            return int(tokens)
        return min(cap, int(getattr(tokenizer, "model_max_length", cap)))

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> latents (B, C, h, w); a video arch also takes
        (B, 3, F, H, W) -> (B, C, f, h, w)."""
        raise NotImplementedError

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents -> pixels (B, 3, H, W) in [-1, 1]."""
        raise NotImplementedError

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One 2-D (L, D) tensor per prompt, at its natural length."""
        raise NotImplementedError

    def get_prompt_embeds_dropped(self, prompts: list[str],
                                  blanks: Sequence[Sequence[bool]]) -> AdvancedPromptEmbeds:
        """`get_prompt_embeds` with `train.prompt_dropout_prob`'s draw (one row of
        `prompt_dropout_encoders` booleans per prompt; aitk.data.captions.dropped_prompts):
        by default a row with any draw set is embedded as "" whole, as upstream's
        single-list encoders do (and where upstream ignores the key: SD3, Lumina 2 and
        its newer BaseModel archs). An arch that draws per text encoder (SDXL) blanks
        each encoder's part on its own."""
        return self.get_prompt_embeds(
            ["" if any(row) else p for p, row in zip(prompts, blanks, strict=True)])

    # Sound (archs whose denoiser has an audio stream; `datasets[].do_audio`): the data
    # layer decodes a clip's soundtrack as `audio_format()` says (aitk.data.audio), the
    # model encodes it with `encode_audio` (cached with the clip's latents), and the
    # batch carries the result in `DataBatch.audio_latents`. The model's
    # `get_noise_prediction` trains its audio stream on them and `side_loss()` gives
    # that stream's loss, which the objective adds to the main loss.
    def audio_format(self) -> tuple[int, int] | None:
        """(sample rate, channels) of the PCM `encode_audio` takes; None (the default):
        the arch trains no sound and `do_audio` is ignored with a warning."""
        return None

    def encode_audio(self, pcm: torch.Tensor, num_frames: int) -> torch.Tensor:
        """(channels, samples) float PCM in [-1, 1] of a clip of `num_frames` frames ->
        its audio latents, in the arch's own layout (one tensor per clip, on the CPU
        after the call; the caches keep it beside the clip's latents)."""
        raise NotImplementedError

    def side_loss(self) -> torch.Tensor | None:
        """The loss of what the last `get_noise_prediction` predicted besides the
        latents (LTX-2's audio stream), already weighted, taken once (the next call
        returns None); None (the default): nothing else was predicted."""
        return None

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        """The schedule training uses (see aitk.diffusion.noise); called after `load_model()`.

        Default: flow matching, no timestep shift. Override to read the model's own
        scheduler config (a shift) or to train with DDPM noise.
        """
        from aitk.diffusion.flow_matching import FlowMatchSchedule

        return FlowMatchSchedule(settings)

    def configure_training(self, train_config: Any) -> None:
        """Called once by the trainer after loading: keep `train:` and build the noise
        schedule from its `timestep_type`, `noise_offset`, `min_snr_gamma`, `snr_gamma`,
        `content_or_style`, `next_sample_timesteps` and denoising-step window."""
        self.train_config = train_config
        self._training_schedule = self.make_training_schedule(NoiseSettings(
            timestep_type=getattr(train_config, "timestep_type", "sigmoid"),
            noise_offset=float(getattr(train_config, "noise_offset", 0.0) or 0.0),
            min_snr_gamma=getattr(train_config, "min_snr_gamma", None),
            snr_gamma=getattr(train_config, "snr_gamma", None),
            content_or_style=getattr(train_config, "content_or_style", "balanced"),
            next_sample_timesteps=int(getattr(train_config, "next_sample_timesteps", 8)),
            denoising_steps=getattr(train_config, "denoising_steps", (0, 999))))

    @property
    def training_schedule(self) -> NoiseSchedule:
        if self._training_schedule is None:
            self._training_schedule = self.make_training_schedule(NoiseSettings())
        return self._training_schedule

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor,
                  timesteps: torch.Tensor) -> torch.Tensor:
        """Mix per the schedule; flow matching: x_t = (1 - s) clean + s noise, s = t/1000."""
        return self.training_schedule.add_noise(clean, noise, timesteps)

    @contextlib.contextmanager
    def guidance_as(self, scales: torch.Tensor | None) -> Iterator[None]:
        """`do_guidance_loss`: inside the block a guidance-distilled model (one with a
        guidance embedding, e.g. Flux dev) feeds `scales` (B,) to it; None changes
        nothing. Models without one ignore `guidance_override`."""
        before = self.guidance_override
        if scales is not None:
            self.guidance_override = scales
        try:
            yield
        finally:
            self.guidance_override = before

    def begin_micro_step(self, index: int) -> None:
        """Called by the loop before each micro-batch with its number, `step *
        accumulation + micro` (the same on every rank, and after a resume): models that
        train parts by turns (Wan 2.2's two experts, `switch_boundary_every`) pick the
        part here, so the choice depends on the step alone. Nothing by default."""

    def condition_noisy_latents(self, noisy_latents: torch.Tensor,
                                batch: DataBatch) -> torch.Tensor:
        """Hook for control/reference conditioning; identity by default."""
        return noisy_latents

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds,
                             batch: DataBatch | None = None, **kwargs: Any) -> torch.Tensor:
        """Forward pass under autograd; timestep on 0..1000 (1000 = pure noise)."""
        raise NotImplementedError

    def get_loss_target(self, *, noise: torch.Tensor, batch: DataBatch,
                        clean_latents: torch.Tensor | None = None,
                        timesteps: torch.Tensor | None = None) -> torch.Tensor:
        """What the prediction is scored against, per the schedule: flow matching's
        velocity `noise - clean`; DDPM's noise or v (which needs `timesteps`)."""
        clean = clean_latents if clean_latents is not None else batch.latents
        if clean is None:
            raise ValueError("get_loss_target needs clean latents")
        if timesteps is None:
            timesteps = torch.zeros(clean.shape[0], device=clean.device)
        return self.training_schedule.target(clean, noise, timesteps)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        raise NotImplementedError

    def check_sample_size(self, gen_config: GenerateImageConfig, why: str) -> None:
        """Refuse a preview whose sides are off the bucket grid (`why`: the arch and
        what sets the grid), before the pipeline fails on it less clearly."""
        div = self.get_bucket_divisibility()
        if gen_config.width % div or gen_config.height % div:
            raise ValueError(f"sample size {gen_config.width}x{gen_config.height} is not a "
                             f"multiple of {div} ({why})")

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image | list[Image.Image]:
        """One preview: an image, or the frames of a video arch's clip."""
        raise NotImplementedError

    def encode_prompts(self, prompts: Iterable[str], batch_size: int = 8
                       ) -> dict[str, AdvancedPromptEmbeds]:
        """Embed each distinct prompt once: {prompt: single-item embeds}.

        Runs `get_prompt_embeds` on chunks of `batch_size` prompts under no_grad. The
        trainer uses it to fill the text-embed cache and to embed the sample prompts
        before it unloads the text encoder, then passes those to `generate_images`.
        """
        unique = list(dict.fromkeys(prompts))
        if not unique:
            return {}
        if self.text_encoder is None:
            raise ModelError("the text encoder is unloaded; embed the sample prompts with "
                             "encode_prompts() before unloading it")
        out: dict[str, AdvancedPromptEmbeds] = {}
        with torch.no_grad():
            for start in range(0, len(unique), batch_size):
                chunk = unique[start:start + batch_size]
                embeds = self.get_prompt_embeds(chunk).detach()
                out.update((p, embeds.select([i])) for i, p in enumerate(chunk))
        return out

    def generate_images(self, configs: Sequence[GenerateImageConfig],
                        prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None
                        ) -> list[Image.Image | list[Image.Image]]:
        """One PIL image (a list of frames for a video arch) per config, deterministic
        per `config.seed`.

        Each distinct prompt and negative prompt is embedded once (prompts found in
        `prompt_embeds` are not re-encoded), `get_generation_pipeline()` is called once
        and `generate_single_image()` once per config, with a CPU `torch.Generator`
        seeded from the config. Runs under `torch.no_grad()` with the modules in eval
        mode; each module's train/eval flag is restored afterwards.
        """
        if not configs:
            return []
        known = dict(prompt_embeds or {})
        texts = [t for c in configs for t in (c.prompt, c.negative_prompt)]
        modules = [m for m in (self.model, self.vae, self.text_encoder,
                               *self.text_encoder_parts().values()) if m is not None]
        modes = [(sub, sub.training) for m in modules for sub in m.modules()]
        try:
            for m in modules:
                m.eval()
            with torch.no_grad():
                known.update(self.encode_prompts(t for t in texts if t not in known))
                pipeline = self.get_generation_pipeline()
                images = []
                for cfg in configs:
                    generator = torch.Generator(device="cpu").manual_seed(int(cfg.seed))
                    images.append(self.generate_single_image(
                        pipeline, cfg, known[cfg.prompt], known[cfg.negative_prompt],
                        generator))
            return images
        finally:
            for sub, mode in modes:
                sub.training = mode

    # ---- 5. saving -----------------------------------------------------------------
    # The denoiser's subfolders in the diffusers layout. Several: get_model_to_train()
    # holds each as the attribute of that name (Wan 2.2's two experts).
    denoiser_subfolders: ClassVar[tuple[str, ...]] = ("transformer",)

    def denoiser_parts(self) -> dict[str, nn.Module]:
        """What a full fine-tune trains and saves of the denoiser: subfolder -> module."""
        module = self.get_model_to_train()
        if len(self.denoiser_subfolders) == 1:
            return {self.denoiser_subfolders[0]: module}
        return {sub: getattr(module, sub) for sub in self.denoiser_subfolders}

    def save_model(self, output_path: str, dtype: torch.dtype = torch.float32) -> None:
        """This model as a complete diffusers folder at `output_path`: the denoiser from
        memory, the other parts from `name_or_path` (aitk.run.model_files)."""
        import json

        import aitk
        from aitk.run.model_files import write_diffusers

        software = json.dumps({"name": aitk.SOFTWARE_NAME, "version": aitk.__version__})
        write_diffusers(Path(output_path), self.denoiser_parts(),
                        str(self.model_config.name_or_path), dtype,
                        {"software": software, "arch": self.arch})

    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        """Internal adapter names -> public names (`diffusion_model.` prefix)."""
        return state_dict

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        """Public names -> the internal names `load` expects; inverse of the above."""
        return state_dict

    def on_lora_file_saved(self, path: Path, network: Any) -> None:
        """Called after `AdapterNetwork.save_file` wrote a LoRA file at `path`: a hook for
        archs that also write the adapter in another layout (e.g. a peft folder)."""

    # LoRA files: one per suffix. A multi-expert model (Wan 2.2 14B) writes one file
    # per expert, `NAME_high_noise.safetensors` and `NAME_low_noise.safetensors` as
    # upstream names them; AdapterNetwork.save_file/load_file and the job's pruning
    # go through these three.
    def lora_file_suffixes(self) -> tuple[str, ...]:
        """The file-name suffixes (before `.safetensors`) of one saved LoRA."""
        return ("",)

    def split_lora_file(self, state_dict: dict[str, torch.Tensor]
                        ) -> dict[str, dict[str, torch.Tensor]]:
        """Public state dict -> {suffix: the keys of that file}."""
        return {"": state_dict}

    def extraction_targets(self, weights: Mapping[str, Sequence[int]],
                           conv: bool = False) -> list[str]:
        """The layers whose difference `job: extract` writes as LoRA, from the denoiser's
        weight names and shapes alone (`weights`: `<layer>.weight` -> shape; names as in
        get_model_to_train()): the Linear (2-D) weights under `lora_block_prefixes`, and
        with `conv` the Conv (4-D) ones there too. Extraction builds no model: this, the
        key conversion and the file split run on an instance that has not loaded."""
        prefixes = tuple(self.lora_block_prefixes)
        out = []
        for name, shape in weights.items():
            layer = name[: -len(".weight")]
            if name.endswith(".weight") and layer.startswith(prefixes) and \
                    (len(shape) == 2 or (conv and len(shape) == 4)):
                out.append(layer)
        return sorted(out)

    def join_lora_files(self, parts: dict[str, dict[str, torch.Tensor]]
                        ) -> dict[str, torch.Tensor]:
        """{suffix: file keys} (the files found) -> one public state dict."""
        out: dict[str, torch.Tensor] = {}
        for part in parts.values():
            out.update(part)
        return out

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        """Write a tiny random-initialised model folder of this arch at `target` (no
        download; each part through its own `save_pretrained`, the folder published by
        one rename). `model.create_if_missing` calls it, so the tiny example configs run
        on a fresh checkout. Archs without one refuse `create_if_missing`."""
        raise NotImplementedError

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        """Image sides must be multiples of this (vae_scale_factor * patch_size)."""
        return 16

    @property
    def text_embedding_space_version(self) -> str:
        """Bump when get_prompt_embeds changes, so on-disk caches invalidate."""
        return "1"

    @property
    def latent_space_version(self) -> str:
        """Bump when encode_images changes, so on-disk caches invalidate."""
        return "1"

    def get_model_to_train(self) -> nn.Module:
        """The module LoRA attaches to."""
        if self.model is None:
            raise RuntimeError("load_model() has not run")
        return self.model

    def identity(self, digest_cache: Path | None = None) -> str:
        """A stable fingerprint of the weights, part of every cache key.

        Default: sha256 over the arch, the text-encoder quantization (it changes the text
        embeddings) and the content of every file under `name_or_path`
        (aitk.models.identity). `digest_cache` (a JSON file) remembers file digests
        across runs, so large models are hashed once. Override when the weights live
        elsewhere (several folders, a hub cache).
        """
        from aitk.models.identity import weights_identity

        cfg = self.model_config
        extra = []
        if getattr(cfg, "quantize_te", False):
            extra.append(f"quantize_te={getattr(cfg, 'qtype_te', 'qfloat8')}")
        return weights_identity(self.arch, str(cfg.name_or_path), extra, digest_cache)

    def unload_text_encoder(self) -> None:
        """Free the text encoder once text embeddings are cached."""
        self.text_encoder = None

    # ---- text-encoder LoRA (`train.train_text_encoder`) ------------------------------
    def text_encoder_parts(self) -> dict[str, nn.Module]:
        """The text encoders this arch can train (a LoRA on them, or a full fine-tune of
        them), by subfolder (`text_encoder`, `text_encoder_2`); none by default. An arch
        that names them embeds prompts under `text_encoder_grad()` and names their LoRA
        keys in its key conversion."""
        return {}

    def text_encoder_grad(self) -> contextlib.AbstractContextManager[Any]:
        """The grad mode of a text-encoder pass: off, unless a text encoder trains."""
        return contextlib.nullcontext() if self.text_encoder_trains else torch.no_grad()

    def train_text_encoders(self) -> None:
        """Called once their adapter is attached: prompts are embedded with gradients
        from now on (live, never cached), and the encoders live on the device."""
        self.text_encoder_trains = True
        for module in self.text_encoder_parts().values():
            module.to(self.device)

    # ---- `model.layer_offloading` (aitk.models.block_offload) -------------------------
    def text_encoders(self) -> list[nn.Module]:
        """The loaded text encoders (`text_encoder`, `text_encoder_2`, ...)."""
        names = sorted(n for n in vars(self) if n.startswith("text_encoder"))
        return [m for n in names if isinstance(m := getattr(self, n), nn.Module)]

    def offload_blocks(self, role: PartRole) -> list[nn.Module]:
        """The repeated blocks of the denoiser (`PartRole.DENOISER`, those the description
        counts as `Part.blocks`) or of the text encoders (`PartRole.TEXT_ENCODER`) that
        `layer_offloading` may keep in CPU memory, in the order they run. Default: the
        items of the trained module's top-level ModuleLists; each text encoder's largest
        ModuleList. Override for a network whose blocks sit elsewhere."""
        from aitk.models.block_offload import repeated_blocks

        if role is PartRole.DENOISER:
            return repeated_blocks(self.get_model_to_train())
        if role is PartRole.TEXT_ENCODER:
            return [b for te in self.text_encoders()
                    for b in repeated_blocks(te, top_level=False)]
        return []
