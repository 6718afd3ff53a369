"""The training job's schema: upstream's YAML format as pydantic models, and pydantic's
errors turned into one line per problem, each naming its field path.

    job: extension
    config:
      name: my_lora
      process:
        - type: sd_trainer            # or ui_trainer, diffusion_trainer, concept_slider
          training_folder: output
          network: {type: lora, linear: 16, linear_alpha: 16}   # absent: full fine-tune
          save / sample / train / model / datasets: ...
    meta: {name: "[name]", version: "1.0"}

The other job kinds (`job: train` sliders, extract, mod, merge, generate) have their own
modules beside this one; aitk.config.kinds names them all. Every model forbids unknown
keys (aitk.config.upstream screens them first, so an upstream-only key is a warning and
a misspelling an error with a suggestion).
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from aitk.config import optimizers
from aitk.config.choices import (
    AUGMENTS,
    LOSS_TYPES,
    LR_SCHEDULERS,
    TIMESTEP_BIASES,
    TIMESTEP_TYPES,
)
from aitk.models.qtypes import QTypeProblem, parse_qtype


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


PositiveInt = Annotated[int, Field(ge=1)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class NetworkKwargs(_Strict):
    only_if_contains: list[str] | None = None
    ignore_if_contains: list[str] | None = None


class NetworkConfig(_Strict):
    # aitk.adapters.network: dora is peft's DoRA; upstream's `locon` is a lora with conv.
    type: Literal["lora", "lokr", "dora"] = "lora"
    linear: PositiveInt | None = None
    rank: PositiveInt | None = None  # upstream's older name for `linear`
    linear_alpha: float | None = None
    alpha: float | None = None
    dropout: Probability | None = None
    # LoCon: rank and alpha of the Conv2d layers of UNet archs (unset: none trained).
    conv: PositiveInt | None = None
    conv_alpha: float | None = None
    lokr_factor: int = -1
    network_kwargs: NetworkKwargs = NetworkKwargs()
    # A LoRA file (this network's layout) the adapter starts from instead of its fresh
    # init; a resumed run's checkpoint wins over it (upstream's order).
    pretrained_lora_path: str | None = None

    @property
    def dim(self) -> int:
        return self.linear or self.rank or 16

    @property
    def scale_alpha(self) -> float:
        for value in (self.linear_alpha, self.alpha):
            if value is not None:
                return float(value)
        return float(self.dim)


SaveDtype = Literal["float16", "fp16", "bfloat16", "bf16", "float32", "fp32"]


class SaveConfig(_Strict):
    dtype: SaveDtype = "float16"
    save_every: PositiveInt = 250
    max_step_saves_to_keep: PositiveInt = 4
    # A LoRA is always one file in the layout the arch's loaders read (see
    # aitk.adapters.keys), so for LoRAs both values mean that (upstream's UI writes
    # "diffusers" into LoRA jobs). A full fine-tune saves a diffusers folder
    # ("diffusers") or one safetensors file of the denoiser (aitk.run.model_files).
    save_format: Literal["safetensors", "diffusers"] = "safetensors"
    # Upload the output folder's LoRA files and previews to this Hugging Face repo at
    # the end of the run (aitk.run.hub); offline or without a token, one line.
    push_to_hub: bool = False
    hf_repo_id: str | None = None
    hf_private: bool = False

    @model_validator(mode="after")
    def _hub_repo(self) -> SaveConfig:
        if self.push_to_hub and not self.hf_repo_id:
            raise ValueError("push_to_hub needs hf_repo_id (the repo to upload to, "
                             "e.g. your-name/my-lora)")
        return self


class LoggingConfig(_Strict):
    """`logging`: the trackers beside loss_log.jsonl (aitk.run.trackers)."""

    use_wandb: bool = False
    project_name: str = "ai-toolkit"
    run_name: str | None = None  # unset: the job's name


def flags_parse(prompt: str) -> str:
    """A prompt's `--flag value` parts (aitk.config.prompt_flags) are known and parse."""
    from aitk.config.prompt_flags import parse_prompt

    parse_prompt(prompt)  # PromptFlagError is a ValueError: a field error
    return prompt


Prompt = Annotated[str, AfterValidator(flags_parse)]


class SampleItem(_Strict):
    prompt: Prompt
    width: PositiveInt | None = None
    height: PositiveInt | None = None
    neg: str | None = None
    seed: int | None = None
    guidance_scale: float | None = None
    sample_steps: PositiveInt | None = None
    num_frames: PositiveInt | None = None  # video archs; unset: the sample section's
    fps: PositiveInt | None = None
    network_multiplier: float | None = None  # the adapter's weight; unset: the section's
    # Edit models: the control (reference) image(s) a preview edits; `ctrl_img` or
    # `ctrl_img_1..3` (upstream's names), in that order (aitk.data.controls).
    ctrl_img: str | None = None
    ctrl_img_1: str | None = None
    ctrl_img_2: str | None = None
    ctrl_img_3: str | None = None

    @property
    def ctrl_imgs(self) -> list[str]:
        """As upstream: `ctrl_img` (else `ctrl_img_1`) first, then _2 and _3."""
        return [p for p in (self.ctrl_img or self.ctrl_img_1, self.ctrl_img_2,
                            self.ctrl_img_3) if p]


class SampleConfig(_Strict):
    sampler: str = "flowmatch"  # upstream's names; the arch's own sampler is used
    sample_every: PositiveInt = 250
    # No cadence previews before this step (upstream's); the step-0 baseline is
    # train.skip_first_sample's and the last step's preview is always made.
    sample_start_step: Annotated[int, Field(ge=0)] = 0
    width: PositiveInt = 512
    height: PositiveInt = 512
    prompts: list[Prompt] = []
    samples: list[SampleItem] | None = None
    neg: str | Literal[False] = ""
    seed: int = 0
    walk_seed: bool = False
    guidance_scale: float = 4.0
    sample_steps: PositiveInt = 20
    format: Literal["jpg", "png", "webp"] = "jpg"
    # Video archs: frames per preview (the arch may round to its 4k+1) and playback rate.
    num_frames: PositiveInt = 1
    fps: PositiveInt = 16
    # The adapter's weight in previews; a prompt's `--m W` flag or an item's own key
    # overrides it (sliders preview both directions, e.g. --m -3 and --m 3).
    network_multiplier: float = 1.0

    @property
    def items(self) -> list[SampleItem]:
        """`samples` wins over the legacy `prompts` list, as upstream."""
        if self.samples is not None:
            return list(self.samples)
        return [SampleItem(prompt=p) for p in self.prompts]


def _optimizer_name(value: Any) -> Any:
    """Upstream's spellings (any case, `prodigyopt`, `adamw8`) -> aitk's names."""
    return optimizers.canonical(value) if isinstance(value, str) else value


def _params_model(name: str) -> type[BaseModel]:
    """The pydantic model of one optimizer's `optimizer_params` (aitk.config.optimizers)."""
    spec = optimizers.OPTIMIZERS[name]
    fields: dict[str, Any] = {key: (kind | None, None) for key, kind in spec.params.items()}
    return create_model(f"{name}_params", __config__=ConfigDict(extra="forbid"), **fields)


class LRSchedulerParams(_Strict):
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    eta_min: Annotated[float, Field(ge=0.0)] = 0.0  # floor of the decay (and restarts)
    # cosine_with_restarts: the first cycle's length in steps (torch's CosineAnnealing-
    # WarmRestarts `T_0`; upstream's `total_iters`), each next cycle T_mult times longer.
    # Unset: one cycle over the whole run (upstream's default).
    T_0: PositiveInt | None = None  # noqa: N815 - torch's and upstream's name
    total_iters: PositiveInt | None = None
    T_mult: PositiveInt = 1  # noqa: N815
    # step: the LR is multiplied by gamma every step_size steps (torch's StepLR).
    step_size: PositiveInt | None = None
    gamma: Annotated[float, Field(gt=0.0)] = 0.1


class EMAConfig(_Strict):
    """`train.ema_config`: the adapter's moving average is what is saved and previewed
    (aitk.run.ema)."""

    use_ema: bool = False
    ema_decay: Probability = 0.999
    # Upstream's: each update pulls the trained weights toward the average, then scales
    # them (aitk.run.ema).
    use_feedback: bool = False
    param_multiplier: Annotated[float, Field(gt=0.0)] = 1.0


class ValidationItem(_Strict):
    image_path: str
    prompt: str = ""


class ValidationConfig(_Strict):
    """`train.validation_config`: a loss on held-out images (aitk.run.validation)."""

    validation_items: list[ValidationItem] = []
    resolution: PositiveInt = 512
    validate_every_n_steps: PositiveInt = 10
    validation_sigmas: Annotated[list[Probability], Field(min_length=1)] = [
        1.0, 0.75, 0.5, 0.25]


class TrainConfig(_Strict):
    steps: PositiveInt = 1000
    batch_size: PositiveInt = 1
    gradient_accumulation: PositiveInt = 1
    gradient_accumulation_steps: PositiveInt = 1  # upstream's legacy name
    lr: Annotated[float, Field(gt=0.0)] = 1e-4
    # A LoRA on the text encoder(s) too, for the archs whose description names their
    # text-encoder keys (sd1, sd2, sdxl); the preflight refuses it for the others. Its
    # rate is `text_encoder_lr` (unset: `lr`), on the same schedule. A full fine-tune
    # (no `network`) trains the denoiser's own weights (`train_unet`) and with
    # `train_text_encoder` the text encoders' (aitk.run.finetune); a LoRA run always
    # trains the denoiser's adapter (the preflight says so when `train_unet` is off).
    train_text_encoder: bool = False
    text_encoder_lr: Annotated[float, Field(gt=0.0)] | None = None
    # The denoiser's rate (its adapter's, or its own weights' in a full fine-tune);
    # unset: `lr`. Like text_encoder_lr a scale of `lr` on the one schedule.
    unet_lr: Annotated[float, Field(gt=0.0)] | None = None
    train_unet: bool = True
    # aitk.config.optimizers lists them, with the packages they need and their settings.
    optimizer: Annotated[Literal[optimizers.NAMES],  # type: ignore[valid-type]
                         BeforeValidator(_optimizer_name)] = "adamw"
    optimizer_params: dict[str, Any] = {}
    lr_scheduler: Literal[LR_SCHEDULERS] = "constant"  # type: ignore[valid-type]
    lr_scheduler_params: LRSchedulerParams = LRSchedulerParams()
    max_grad_norm: Annotated[float, Field(ge=0.0)] = 1.0
    dtype: Literal["fp32", "float32", "bf16", "bfloat16"] = "fp32"
    # The arch's own schedule names (aitk.models.description: `flowmatch`, or `ddpm` and
    # its upstream siblings for the DDPM archs); unset: the arch's first. Checked
    # against the arch by aitk.config.archfit.
    noise_scheduler: str | None = None
    timestep_type: Literal[TIMESTEP_TYPES] = "sigmoid"  # type: ignore[valid-type]
    next_sample_timesteps: Annotated[int, Field(ge=3)] = 8  # timestep_type next_sample
    content_or_style: Literal[TIMESTEP_BIASES] = "balanced"  # type: ignore[valid-type]
    # The window of the 1000-step training schedule a step draws from, as indices
    # counted from pure noise (0) to the clean image (999), upstream's way
    # (aitk.diffusion.timesteps: a range of the timestep distribution's quantiles).
    # Above 999 reads as 999, as upstream clips it (its example configs write 1000).
    min_denoising_steps: Annotated[int, Field(ge=0)] = 0
    max_denoising_steps: Annotated[int, Field(ge=0)] = 999
    noise_offset: Annotated[float, Field(ge=0.0)] = 0.0
    min_snr_gamma: Annotated[float, Field(gt=0.0)] | None = None  # DDPM archs (SDXL)
    snr_gamma: Annotated[float, Field(gt=0.0)] | None = None  # gamma / SNR; wins over min
    # Flux: the value fed to a guidance-distilled model's guidance embedding.
    cfg_scale: float = 1.0
    bypass_guidance_embedding: bool = False
    # Multi-expert models (wan22_14b): train one expert for this many micro-batches,
    # then the other (upstream's key).
    switch_boundary_every: PositiveInt = 1
    # Archs that train sound (datasets[].do_audio): the audio stream's loss counts this
    # many times the video's (upstream's key and default).
    audio_loss_multiplier: Annotated[float, Field(ge=0.0)] = 1.0
    # Regularization datasets (`datasets[].is_reg`): how much their loss counts.
    reg_weight: Annotated[float, Field(ge=0.0)] = 1.0
    loss_type: Literal[LOSS_TYPES] = "mse"  # type: ignore[valid-type]
    # Upstream's: a micro-step's diffusion loss is clamped at it, so a step above it
    # trains nothing (aitk.run.objectives.Objective).
    max_loss: Annotated[float, Field(gt=0.0)] | None = None
    # Extra loss terms (aitk.run.objectives), each as upstream.
    diff_output_preservation: bool = False
    diff_output_preservation_multiplier: float = 1.0
    diff_output_preservation_class: str = ""
    blank_prompt_preservation: bool = False
    blank_prompt_preservation_multiplier: float = 1.0
    inverted_mask_prior: bool = False  # with dataset masks
    inverted_mask_prior_multiplier: float = 0.5
    do_guidance_loss: bool = False
    guidance_loss_target: float | Annotated[list[float], Field(min_length=2,
                                                               max_length=2)] = 3.0
    do_guidance_loss_cfg_zero: bool = False
    guidance_loss_schedule: Literal["constant", "sigma"] = "constant"
    unconditional_prompt: str = ""
    # Upstream's: each item's prompt is blanked with this probability per text encoder
    # when prompts are embedded live (not with cached text embeddings); the draw is per
    # batch, item and encoder (aitk.data.captions.dropped_prompts), the blank is the
    # arch's embedding of "" (BaseModel.get_prompt_embeds_dropped).
    prompt_dropout_prob: Probability = 0.0
    ema_config: EMAConfig = EMAConfig()
    validation_config: ValidationConfig | None = None
    gradient_checkpointing: bool = True
    cache_text_embeddings: bool = False
    unload_text_encoder: bool = False  # aitk: same as cache_text_embeddings
    skip_first_sample: bool = False
    disable_sampling: bool = False
    seed: int = 42

    @field_validator("optimizer_params")
    @classmethod
    def _known_optimizer_params(cls, value: dict[str, Any], info: ValidationInfo
                                ) -> dict[str, Any]:
        """Each optimizer's own settings, checked by name and type; unset ones are left to
        aitk.config.optimizers' defaults."""
        name = info.data.get("optimizer")
        if name is None:  # the optimizer itself is wrong: that error says it
            return value
        valid = optimizers.OPTIMIZERS[name].params
        unknown = sorted(k for k in value if k not in valid)
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} "
                             f"{'is not a setting' if len(unknown) == 1 else 'are not settings'}"
                             f" of optimizer {name}; its settings: {', '.join(valid)}")
        try:
            checked = _params_model(name).model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"{'.'.join(map(str, first['loc']))}: {first['msg'].lower()} "
                             f"(got {first.get('input')!r})") from None
        return checked.model_dump(exclude_none=True)

    @model_validator(mode="after")
    def _schedule_settings(self) -> TrainConfig:
        if self.lr_scheduler == "step" and self.lr_scheduler_params.step_size is None:
            raise ValueError("lr_scheduler step needs lr_scheduler_params.step_size (the LR "
                             "is multiplied by gamma every step_size steps)")
        p = self.lr_scheduler_params
        if p.T_0 is not None and p.total_iters is not None and p.T_0 != p.total_iters:
            raise ValueError("lr_scheduler_params: set T_0 or total_iters (the same "
                             "setting), not both")
        return self

    @model_validator(mode="after")
    def _one_accumulation_key(self) -> TrainConfig:
        if self.gradient_accumulation > 1 and self.gradient_accumulation_steps > 1:
            raise ValueError("set gradient_accumulation or gradient_accumulation_steps, "
                             "not both")
        return self

    @model_validator(mode="after")
    def _guidance_loss_needs_the_embedding(self) -> TrainConfig:
        if self.do_guidance_loss and self.bypass_guidance_embedding:
            raise ValueError("do_guidance_loss feeds the guidance embedding; it cannot be "
                             "used with bypass_guidance_embedding")
        return self

    @model_validator(mode="after")
    def _denoising_window(self) -> TrainConfig:
        if self.min_denoising_steps > self.max_denoising_steps:
            raise ValueError(f"min_denoising_steps ({self.min_denoising_steps}) is above "
                             f"max_denoising_steps ({self.max_denoising_steps}): no "
                             "timestep is left to train on")
        return self

    @property
    def accumulation(self) -> int:
        return max(self.gradient_accumulation, self.gradient_accumulation_steps)

    @property
    def denoising_steps(self) -> tuple[int, int]:
        """The training schedule's window (BaseModel.configure_training reads it)."""
        last = min(self.max_denoising_steps, 999)
        return min(self.min_denoising_steps, last), last


def _qtype(value: str) -> str:
    try:
        parse_qtype(value)
    except QTypeProblem as exc:
        raise ValueError(str(exc)) from None
    return value


class ModelConfig(_Strict):
    name_or_path: str
    arch: str
    quantize: bool = False
    quantize_te: bool | None = None
    # aitk.models.qtypes: a weight type, optionally `|` an accuracy recovery adapter
    qtype: Annotated[str, AfterValidator(_qtype)] = "qfloat8"
    qtype_te: Annotated[str, AfterValidator(_qtype)] = "qfloat8"
    # A LoRA fitted to undo the quantization error, applied frozen (aitk.models.
    # recovery_adapter); the same as `qtype: "uint3|PATH"`.
    accuracy_recovery_adapter: str | None = None
    low_vram: bool = False  # keep idle parts (text encoders, VAE) on the CPU
    # Step-distilled models (Flux schnell, Z-Image Turbo, Krea 2 Turbo): the
    # de-distillation LoRA merged into the frozen base (aitk.models.assistant).
    assistant_lora_path: str | None = None
    # A LoRA fused into the frozen denoiser before training (aitk.models.fused_lora):
    # training and previews run on the model with it; the saved LoRA holds only what
    # was trained.
    lora_path: str | None = None
    # Where the parts `name_or_path` lacks come from (text encoder, tokenizer, VAE,
    # scheduler): Z-Image De-Turbo ships only its transformer.
    extras_name_or_path: str | None = None
    # A share of the denoiser's / text encoders' repeated blocks waits in CPU memory
    # and visits the device for its forward and backward (aitk.models.block_offload).
    layer_offloading: bool = False
    layer_offloading_transformer_percent: Probability = 1.0
    layer_offloading_text_encoder_percent: Probability = 1.0
    # torch.compile per denoiser block (aitk.models.block_compile); `compile` (upstream:
    # the whole model) compiles per block too. Off by default, as upstream.
    compile: bool = False
    block_compile: bool = False
    compile_mode: Literal["default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = "default"
    compile_fullgraph: bool = False
    compile_dynamic: bool | None = True
    cache_size_limit: PositiveInt | None = None
    # DDPM archs (sdxl): true = v-prediction, false = epsilon; unset = the model's
    # scheduler config says.
    is_v_pred: bool | None = None
    # Flux (upstream's key): zero the T5 states of the padding tokens (aitk.config.archfit
    # refuses it for an arch whose description does not take it).
    attn_masking: bool = False
    model_kwargs: dict[str, Any] = {}
    # aitk: build the arch's tiny random model (BaseModel.build_tiny) at name_or_path
    # when it is absent, so the tiny example jobs run on a fresh checkout.
    create_if_missing: bool = False
    # A full fine-tune trains the parameters whose name (`transformer.` + the name in the
    # denoiser) contains one of `only_if_contains` and none of `ignore_if_contains`
    # (upstream's keys and matching); a LoRA run selects layers with network_kwargs.
    only_if_contains: list[str] | None = None
    ignore_if_contains: list[str] | None = None

    @model_validator(mode="after")
    def _te_follows_quantize(self) -> ModelConfig:
        if self.quantize_te is None:
            self.quantize_te = self.quantize
        return self

    @model_validator(mode="after")
    def _one_recovery_adapter(self) -> ModelConfig:
        in_qtype = parse_qtype(self.qtype).adapter
        if in_qtype and self.accuracy_recovery_adapter and \
                in_qtype != self.accuracy_recovery_adapter:
            raise ValueError("qtype names one accuracy recovery adapter and "
                             "accuracy_recovery_adapter another; keep one")
        return self

    @property
    def recovery_adapter(self) -> str | None:
        """The accuracy recovery adapter for the quantized transformer, if any."""
        if not self.quantize:
            return None
        return parse_qtype(self.qtype).adapter or self.accuracy_recovery_adapter


class DatasetConfig(_Strict):
    folder_path: str
    caption_ext: str = "txt"
    default_caption: str | None = None
    trigger_word: str | None = None
    caption_dropout_rate: Probability = 0.0
    num_repeats: PositiveInt = 1
    resolution: PositiveInt | list[PositiveInt] = 512
    cache_latents: bool = False
    cache_latents_to_disk: bool = False
    cache_text_embeddings: bool = False
    # Video archs (aitk.data.video): frames per clip; 1 = images only (videos skipped).
    num_frames: PositiveInt = 1  # the arch's frame rule: aitk.config.archfit
    fps: PositiveInt = 24  # with shrink_video_to_frames false: the rate frames are taken at
    shrink_video_to_frames: bool = True  # spread num_frames over the whole clip
    # Edit models: folders of control images paired with the images by file stem
    # (a list for several references; `control_path_1..3` are upstream's other names).
    control_path: str | list[str] | None = None
    control_path_1: str | None = None
    control_path_2: str | None = None
    control_path_3: str | None = None
    # Masked loss (aitk.data.masks): a folder of masks paired by file stem, or the
    # image's alpha channel; black is left out of the loss.
    mask_path: str | None = None
    alpha_mask: bool = False
    invert_mask: bool = False
    mask_min_value: Probability = 0.0
    # Differential output preservation for this dataset's items (aitk.run.objectives):
    # on with train.diff_output_preservation too; its class word wins over train's.
    diff_output_preservation: bool = False
    diff_output_preservation_class: str = ""
    # Video archs: each video's own length at `fps` (snapped to 4k+1) instead of
    # num_frames; `trim_auto_frame_count_tail` takes the frames from the start at fps
    # and drops the few left over (false: spread over the whole clip).
    auto_frame_count: bool = False
    trim_auto_frame_count_tail: bool = True
    # Archs that train sound (ltx2): each video's audio track trains with its frames
    # (aitk.data.audio); a video without one trains video only. Other archs: ignored,
    # with a warning.
    do_audio: bool = False
    audio_normalize: bool = False  # each soundtrack's peak scaled to 0.999 (upstream's)
    # A soundtrack stretched to the clip's duration keeps its pitch (FFmpeg's atempo);
    # false: resampled linearly, the pitch moving with the speed (upstream's default).
    audio_preserve_pitch: bool = False
    # Batches come from one dataset at a time (as upstream); unset: train.batch_size.
    batch_size: PositiveInt | None = None
    # Regularization (aitk.data.batches): its own batch order, every other step, loss
    # times train.reg_weight, the trigger word not added; prior_reg: trained toward the
    # base model's own prediction.
    is_reg: bool = False
    prior_reg: bool = False
    loss_multiplier: Annotated[float, Field(ge=0.0)] = 1.0
    # Augmentation (aitk.data.augment): mirrored copies, and random transforms per draw.
    flip_x: bool = False
    flip_y: bool = False
    augments: list[Literal[AUGMENTS]] = []  # type: ignore[valid-type]
    # Caption changes per draw (aitk.data.captions).
    shuffle_tokens: bool = False
    keep_tokens: Annotated[int, Field(ge=0)] = 0
    token_dropout_rate: Probability = 0.0
    random_triggers: list[str] | str = []  # a list, or a text file with one per line
    random_triggers_max: PositiveInt = 1
    # Caption text replacements, "from|to" each, applied in order to the caption file's
    # (or default_caption's) text before the trigger rules (aitk.data.dataset).
    replacements: list[str] = []
    # Cropping and scaling before the bucket (aitk.data.buckets, upstream's keys):
    # `scale` shrinks each image first (aitk never upscales: at most 1); `square_crop`
    # trains at a resolution-sided square, centre-cropped; `random_crop` draws the
    # crop's offset at every draw instead of the centre; `random_scale` draws the zoom
    # too (and implies random_crop, as upstream). Random crops are encoded per draw.
    # The adapter's multiplier for this dataset's batches (upstream's): 0 trains them
    # through the base model alone, 0.5 at half the adapter's change.
    network_weight: float = 1.0
    scale: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    square_crop: bool = False
    random_crop: bool = False
    random_scale: bool = False

    @property
    def random_pixels(self) -> bool:
        """Its pixels differ at every draw: encoded per batch, never from the cache."""
        return bool(self.augments) or self.random_crop or self.random_scale

    @model_validator(mode="after")
    def _random_crops_have_no_controls(self) -> DatasetConfig:
        if (self.random_crop or self.random_scale) and self.control_paths:
            on = "random_scale" if self.random_scale else "random_crop"
            raise ValueError(f"{on} crops each image differently at every draw, and its "
                             "control images are fitted to the bucket's centre; turn "
                             f"{on} off for a dataset with control_path")
        return self

    @field_validator("replacements")
    @classmethod
    def _from_bar_to(cls, value: list[str]) -> list[str]:
        for entry in value:
            if entry.count("|") != 1 or not entry.split("|")[0]:
                raise ValueError(f"{entry!r} is not \"from|to\": give the text to replace, "
                                 "one |, then its replacement (empty to delete it)")
        return value

    @property
    def replacement_pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple((e.split("|")[0], e.split("|")[1]) for e in self.replacements)

    @property
    def control_paths(self) -> list[str]:
        """Every control folder, in order: control_path (or its list), then _1.._3."""
        first = self.control_path if isinstance(self.control_path, list) else \
            [self.control_path]
        return [p for p in (*first, self.control_path_1, self.control_path_2,
                            self.control_path_3) if p]

    @property
    def resolutions(self) -> list[int]:
        res = self.resolution if isinstance(self.resolution, list) else [self.resolution]
        return sorted(set(res))


class TrainingProcess(_Strict):
    """What every training process has: LoRA/LoKr training, a full fine-tune, both
    sliders. `network` absent means a full fine-tune (aitk.run.finetune)."""

    training_folder: str = "output"
    device: str | None = None  # None: cuda when available, else cpu
    gpus: PositiveInt = 1  # > 1: run.py starts torchrun (aitk.run.torchrun)
    trigger_word: str | None = None
    # TensorBoard event files go under it (aitk.run.trackers); unset: the config's.
    log_dir: str | None = None
    logging: LoggingConfig = LoggingConfig()
    network: NetworkConfig | None = None
    save: SaveConfig = SaveConfig()
    sample: SampleConfig = SampleConfig()
    train: TrainConfig = TrainConfig()
    model: ModelConfig
    datasets: list[DatasetConfig] = []  # required (min 1) but for the slider

    @property
    def full_fine_tune(self) -> bool:
        return self.network is None

    @model_validator(mode="after")
    def _network_weight_needs_an_adapter(self) -> TrainingProcess:
        weighted = [i for i, ds in enumerate(self.datasets) if ds.network_weight != 1.0]
        if weighted and (self.full_fine_tune or getattr(self, "slider", None) is not None):
            what = "a full fine-tune has no adapter" if self.full_fine_tune else \
                "a slider sets its adapter's multipliers itself"
            raise ValueError(f"datasets[{weighted[0]}].network_weight scales the adapter "
                             f"for that dataset's batches, but {what}; remove it")
        return self


class ProcessConfig(TrainingProcess):
    type: Literal["sd_trainer", "ui_trainer", "diffusion_trainer"] = "sd_trainer"
    datasets: Annotated[list[DatasetConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _trained_text_encoder_is_live(self) -> ProcessConfig:
        cached = [name for name, on in (
            ("train.cache_text_embeddings", self.train.cache_text_embeddings),
            ("train.unload_text_encoder", self.train.unload_text_encoder),
            *((f"datasets[{i}].cache_text_embeddings", ds.cache_text_embeddings)
              for i, ds in enumerate(self.datasets))) if on]
        if self.train.train_text_encoder and cached:
            raise ValueError(f"train.train_text_encoder embeds every caption live with the "
                             f"text encoders' LoRA, so their embeddings cannot be cached; "
                             f"turn off {', '.join(cached)}")
        return self


class ConceptSliderSettings(_Strict):
    """The `slider:` section of a `concept_slider` process (upstream's names and
    defaults): the LoRA at +1 moves the `target_class` prediction towards
    `positive_prompt` and away from `negative_prompt` by `guidance_strength`, at -1 the
    other way; `anchor_class` (when set, even to "") keeps its prediction unchanged,
    weighted by `anchor_strength` (aitk.run.slider)."""

    guidance_strength: float = 3.0
    anchor_strength: float = 1.0
    positive_prompt: str = ""
    negative_prompt: str = ""
    target_class: str = ""
    anchor_class: str | None = None

    @model_validator(mode="after")
    def _has_a_direction(self) -> ConceptSliderSettings:
        if not (self.positive_prompt.strip() or self.negative_prompt.strip()):
            raise ValueError("set positive_prompt or negative_prompt (the two ends of the "
                             "slider)")
        return self


class ConceptSliderProcess(ProcessConfig):
    """`type: concept_slider`: a LoRA trained on the datasets' images with the slider
    loss instead of the denoising loss."""

    type: Literal["concept_slider"] = "concept_slider"  # type: ignore[assignment]
    network: NetworkConfig  # a slider is a LoRA: required
    slider: ConceptSliderSettings


def by_type(*models: type[BaseModel]) -> Any:
    """A union of section models told apart by their `type:` value. A value none of
    them takes validates against the first (its error lists the values it takes). The
    union's tags carry a ':' so that error paths skip them (see _loc)."""
    tags: dict[Any, str] = {}
    for model in models:
        for value in typing.get_args(model.model_fields["type"].annotation):
            tags.setdefault(value, f"type:{model.__name__}")

    def pick(value: Any) -> str:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return tags.get(kind, f"type:{models[0].__name__}")

    members = tuple(Annotated[m, Tag(f"type:{m.__name__}")] for m in models)
    return Annotated[typing.Union[members], Discriminator(pick)]  # noqa: UP007


def model_for_type(models: Iterable[type[BaseModel]], value: Any) -> type[BaseModel]:
    """The model of `models` whose `type` takes value["type"] (the first one else)."""
    models = list(models)
    kind = value.get("type") if isinstance(value, dict) else None
    for model in models:
        field = model.model_fields.get("type")
        if field is not None and kind in typing.get_args(field.annotation):
            return model
    return models[0]


ExtensionProcess = by_type(ProcessConfig, ConceptSliderProcess)
# Filesystems allow 255 bytes a name; the longest one a run writes is the temp file of a
# step LoRA, `.NAME_000000250_high_noise.safetensors.XXXXXXXX.tmp` (NAME + 47 bytes).
MAX_NAME_BYTES = 200


def one_path_component(name: str) -> str:
    """The job name becomes a folder and file names: one plain path component, short
    enough for every file name built from it."""
    if name in (".", "..") or any(c in name for c in "/\\\0") or Path(name).is_absolute():
        raise ValueError(f"must be one folder name (no '/', '\\', '..' or absolute path; "
                         f"got {name!r}): it names the output folder and its files")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ValueError(f"is {size} bytes long, more than {MAX_NAME_BYTES}: it names the "
                         "output folder and files like NAME_000000250.safetensors, and "
                         "filesystems allow 255 bytes a name; use a shorter name")
    return name


JobName = Annotated[str, Field(min_length=1), AfterValidator(one_path_component)]


class JobBase(_Strict):
    """What every job kind answers (aitk.config.kinds lists the kinds, by their `job:`
    value): its name, its processes, and the folder it writes in."""

    job: str  # each kind narrows it to its one value
    meta: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self.config.name  # type: ignore[attr-defined]

    @property
    def processes(self) -> list[Any]:
        return list(self.config.process)  # type: ignore[attr-defined]

    def output_dir(self) -> Path:
        """The folder this job writes in (the first process's; the web UI lists it)."""
        raise NotImplementedError

    def status_dir(self) -> Path | None:
        """Where `status.json` goes when no watcher names a file (AITK_STATUS_FILE): a
        training run's own folder; None for jobs that write into a user's folder."""
        return None


class JobSection(_Strict):
    name: JobName
    process: Annotated[list[ExtensionProcess], Field(min_length=1)]
    log_dir: str | None = None  # every process's TensorBoard folder (upstream's)


class JobConfig(JobBase):
    """`job: extension`: LoRA/LoKr training, full fine-tunes and concept sliders."""

    job: Literal["extension"] = "extension"
    config: JobSection

    def output_dir(self) -> Path:
        return Path(self.config.process[0].training_folder).expanduser() / self.name

    def status_dir(self) -> Path | None:
        return self.output_dir()


# Each schema class is the aitk side of one upstream section (aitk.config.upstream_keys);
# the other kinds' modules add theirs (aitk.config.kinds).
SECTION_NAMES: dict[type[BaseModel], str] = {
    JobConfig: "job", JobSection: "config", ProcessConfig: "process",
    ConceptSliderProcess: "process", ConceptSliderSettings: "concept_slider",
    NetworkConfig: "network", NetworkKwargs: "network.network_kwargs", SaveConfig: "save",
    LoggingConfig: "logging",
    SampleConfig: "sample", SampleItem: "sample.samples", TrainConfig: "train",
    LRSchedulerParams: "train.lr_scheduler_params", EMAConfig: "train.ema_config",
    ValidationConfig: "train.validation_config",
    ValidationItem: "train.validation_config.validation_items", ModelConfig: "model",
    DatasetConfig: "datasets",
}


def join_path(path: str, key: Any) -> str:
    """A field path one level down: ("config.process[0]", "train") -> "...[0].train"."""
    return f"{path}.{key}" if path else str(key)


# ---- pydantic's errors as config problems ---------------------------------------------
def _loc(loc: Iterable[Any], data: Any) -> str:
    """A pydantic location as a config path, skipping union-branch tags like `int`."""
    out = ""
    for part in loc:
        if isinstance(part, int) and isinstance(data, list) and part < len(data):
            out, data = f"{out}[{part}]", data[part]
        elif isinstance(part, str) and isinstance(data, dict) and part in data:
            out, data = join_path(out, part), data[part]
        elif isinstance(part, str) and isinstance(data, dict | None) and \
                not any(c in part for c in "[-:"):  # union tags: `int`, `process:...`
            out, data = join_path(out, part), None  # a missing key
    return out


def _expected(err: Any) -> str:
    msg = err["msg"]
    if err["type"] == "missing":
        return "required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err["type"] in ("value_error", "assertion_error"):
        return msg
    return f"{msg[0].lower()}{msg[1:]} (got {err.get('input')!r})"


def validation_problems(exc: ValidationError, data: Any) -> list[str]:
    found: dict[str, str] = {}
    for err in exc.errors():
        where = _loc(err["loc"], data) or "(top level)"
        found.setdefault(where, f"{where}: {_expected(err)}")
    # A union reports one error per branch; keep the most specific path.
    return [line for where, line in found.items()
            if not any(o != where and o.startswith((f"{where}.", f"{where}["))
                       for o in found)]
