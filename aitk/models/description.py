"""What an arch is, said without torch: the facts the schema, the preflight, the audits,
`aitk models`, the web UI's model picker and the memory forecast read.

Each arch folder declares its descriptions in `aitk/models/<folder>/arch.py`
(`DESCRIPTIONS`), a module that imports only this one (stdlib + pydantic), so reading
them costs no torch, diffusers or weights. `aitk.models.catalog` finds and looks them
up; `tests/aitk/models/test_arch_descriptions.py` holds each fact to what the arch's
loaded tiny model does and each parameter count to a meta-device build of the real
config.

An extension's model class may carry one as its `description` class attribute; one
without gets `minimal_description(cls)`, in which what is not known is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from aitk.errors import ModelKwargsError

# `train.noise_scheduler` values. Flow-matching archs take upstream's one name. DDPM
# archs take every name of upstream's sampler table (toolkit/sampler.py get_sampler)
# whose scheduler shares the model's DDPM betas: their forward process is the same, so
# aitk trains them all as DDPM; upstream's SDXL form writes `ddpm`.
FLOWMATCH_SCHEDULERS: tuple[str, ...] = ("flowmatch",)
DDPM_SCHEDULERS: tuple[str, ...] = (
    "ddpm", "ddim", "pndm", "lms", "k_lms", "euler", "k_euler", "euler_a", "heun",
    "dpm_2", "dpm_2_a", "dpmsolver", "dpmsolver++", "k_dpmsolver", "k_dpmsolver++",
    "dpmsingle")


class PartRole(str, Enum):
    DENOISER = "denoiser"  # the transformer / UNet the LoRA trains
    TEXT_ENCODER = "text_encoder"
    VAE = "vae"
    IMAGE_ENCODER = "image_encoder"  # e.g. Wan 2.1 i2v's CLIP vision tower
    # A second denoiser that only previews run, for guidance, never trained (Ideogram 4's
    # unconditional transformer); quantized with the denoiser, idle on the CPU with
    # `low_vram`.
    GUIDANCE = "guidance"


@dataclass(frozen=True)
class Part:
    """One folder of a model (`subfolder/` of the diffusers layout) as aitk loads it."""

    subfolder: str
    role: PartRole
    params: int | None  # parameters the loader reads from the real config; None: unknown
    # What stays after loading when the arch drops modules it never runs (a vision
    # tower text-to-image does not use, decoder layers past the deepest one read).
    kept_params: int | None = None
    blocks: int = 0  # denoisers: the repeated blocks (items of its top-level ModuleLists)
    block_params: int = 0  # the parameters inside those blocks (what offloading moves)
    float32: bool = False  # kept in float32 whatever `train.dtype` says (the VAEs)

    @property
    def resident_params(self) -> int | None:
        return self.params if self.kept_params is None else self.kept_params


@dataclass(frozen=True)
class Variant:
    """A released model the arch covers: its parts at their real sizes."""

    tag: str  # upstream's `arch:tag` where it has one (`wan21:14b`), else a short name
    summary: str
    repos: tuple[str, ...]  # hub ids (the first one's configs gave the counts)
    parts: tuple[Part, ...]
    # What `arch: NAME:TAG` fills in where the job leaves it unset, as upstream's web UI
    # does for that choice: (dotted path under the process, value), e.g.
    # ("model.assistant_lora_path", "owner/repo/adapter.safetensors").
    tag_defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def params(self) -> int | None:
        counts = [p.params for p in self.parts]
        return None if any(c is None for c in counts) else sum(c for c in counts if c)

    def part(self, subfolder: str) -> Part:
        for p in self.parts:
            if p.subfolder == subfolder:
                return p
        raise KeyError(f"{self.tag} has no part {subfolder!r}")


@dataclass(frozen=True)
class Schedule:
    kind: Literal["flowmatch", "ddpm"]
    noise_schedulers: tuple[str, ...]  # `train.noise_scheduler` values; the first is the default


@dataclass(frozen=True)
class Frames:
    """A video arch's clip lengths: `step * k + 1` frames (Wan's causal VAE: 4k + 1); a
    still image is a 1-frame clip."""

    step: int

    def allows(self, frames: int) -> bool:
        return frames >= 1 and (frames - 1) % self.step == 0

    def __str__(self) -> str:
        return f"{self.step}k+1"


@dataclass(frozen=True)
class Capabilities:
    video: Frames | None = None  # None: an image arch (1 frame)
    audio: bool = False
    control_images: int = 0  # 0: text to image; 1: edit pairs; n > 1: up to n references
    first_frame: bool = False  # image to video: the clip's first frame conditions it
    experts: tuple[str, ...] = ()  # multistage: the denoiser subfolders trained by turns
    # `model.attn_masking` (upstream's, Flux only): the T5 states of the padding tokens
    # are zeroed, so the denoiser's attention over the prompt reads only what it says.
    attn_masking: bool = False


class KeyStyle(str, Enum):
    PEFT = "peft"  # <prefix><module path>.lora_A.weight / .lora_B.weight / .alpha
    KOHYA = "kohya"  # <prefix><module path, dots as _>.lora_down.weight / .lora_up.weight / .alpha


class ModuleNames(str, Enum):
    # the diffusers model's module paths (transformers' for a text encoder)
    DIFFUSERS = "diffusers"
    ORIGINAL = "original"  # the model authors' checkpoint names (BFL's, Wan's): ComfyUI's


@dataclass(frozen=True)
class LoraKeys:
    prefix: str  # "transformer.", "diffusion_model.", "lora_unet_"
    names: ModuleNames
    style: KeyStyle

    def __str__(self) -> str:
        return f"{self.prefix} + {self.names.value} names ({self.style.value})"


@dataclass(frozen=True)
class Lora:
    writes: LoraKeys
    reads: tuple[LoraKeys, ...] = ()  # read back besides `writes`
    loaders: tuple[str, ...] = ()  # what loads the written file, proven by the arch's tests
    files: tuple[str, ...] = ("",)  # file-name suffixes of one LoRA (one file per expert)
    # With `train.train_text_encoder`: each text encoder's keys in the same file, in the
    # order of the model's text_encoder_parts(); empty: the arch trains its denoiser only.
    text_encoders: tuple[LoraKeys, ...] = ()
    # The file carries `<module>.alpha` keys; False: alpha is folded into the up weights
    # (for loaders that refuse any other key, e.g. diffusers' Krea2Pipeline).
    alpha_keys: bool = True


@dataclass(frozen=True)
class Defaults:
    """A new job's starting point in the web UI: the arch's 24 GB example's values."""

    resolution: tuple[int, ...]
    steps: int
    rank: int
    alpha: float
    lr: float
    timestep_type: str | None  # None: the arch's schedule does not read it (DDPM)
    quantize: bool  # the denoiser quantized on a 24 GB card


@dataclass(frozen=True)
class Examples:
    """Files in config/examples/ for this arch (a shared one names a sibling arch: set
    `model.arch` to this one)."""

    tiny: str | None = None  # trains on the CPU as shipped (tiny random model)
    full: str | None = None  # the real weights on one 24 GB GPU


class ArchKwargs(BaseModel):
    """An arch's own `model.model_kwargs` knobs; subclass it with typed fields. A key
    the arch does not read is an error naming the valid ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AnyKwargs(ArchKwargs):
    """The knobs of an arch that declares none (an extension without a description):
    anything goes, as attributes."""

    model_config = ConfigDict(extra="allow", frozen=True)


@dataclass(frozen=True)
class ArchDescription:
    name: str  # the `model.arch` value
    summary: str  # one line a newcomer understands
    model_class: str  # "module:Class", imported only when a job loads the model
    aliases: tuple[str, ...] = ()  # other `model.arch` values meaning this arch
    upstream_flags: tuple[str, ...] = ()  # upstream's `model.is_*` flags that mean this arch
    size_multiple: int | None = None  # image sides are multiples of this; None: unknown
    capabilities: Capabilities | None = None
    schedule: Schedule | None = None
    model_kwargs: type[ArchKwargs] = AnyKwargs
    lora: Lora | None = None
    variants: tuple[Variant, ...] = ()
    defaults: Defaults | None = None
    examples: Examples = Examples()
    # The loader reads the denoiser (and its text encoder where it can) block by block,
    # quantizing each before the next (BaseModel.load_denoiser and
    # aitk.models.quantized_loading), so no part exists whole in float; the memory
    # forecast's load peak follows (aitk.memory.forecast.loading).
    quantizes_while_loading: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def variant(self, tag: str) -> Variant:
        for v in self.variants:
            if v.tag == tag:
                return v
        raise KeyError(f"{self.name} has no variant {tag!r}; it has "
                       f"{', '.join(v.tag for v in self.variants) or 'none'}")

    def parse_model_kwargs(self, raw: Mapping[str, Any] | None) -> ArchKwargs:
        """`model.model_kwargs` as this arch's typed knobs; raises
        ModelKwargsError with one line per problem."""
        try:
            return self.model_kwargs.model_validate(dict(raw or {}))
        except ValidationError as exc:
            raise ModelKwargsError(self.name, kwargs_problems(self, exc)) from None

    def to_json(self) -> dict[str, Any]:
        """What people and the web UI read about the arch (`python -m aitk models
        --json`): plain JSON, unknowns as null."""
        caps, sched, lora = self.capabilities, self.schedule, self.lora
        return {
            "arch": self.name, "summary": self.summary, "aliases": list(self.aliases),
            "upstream_flags": list(self.upstream_flags), "size_multiple": self.size_multiple,
            "capabilities": None if caps is None else {
                "video": str(caps.video) if caps.video else None, "audio": caps.audio,
                "control_images": caps.control_images, "first_frame": caps.first_frame,
                "experts": list(caps.experts)},
            "schedule": None if sched is None else {
                "kind": sched.kind, "noise_schedulers": list(sched.noise_schedulers)},
            "model_kwargs": list(knob_names(self.model_kwargs)),
            "lora": None if lora is None else {
                "writes": str(lora.writes), "reads": [str(k) for k in lora.reads],
                "loaders": list(lora.loaders), "files": list(lora.files),
                "alpha_keys": lora.alpha_keys},
            "variants": [{"tag": v.tag, "summary": v.summary, "repos": list(v.repos),
                          "params": v.params} for v in self.variants],
            "defaults": None if self.defaults is None else {
                **asdict(self.defaults), "resolution": list(self.defaults.resolution)},
            "examples": asdict(self.examples),
        }

    def check_model_kwargs(self, raw: Mapping[str, Any] | None) -> list[str]:
        """The problems of `model.model_kwargs` for this arch, one line each ([] = fine)."""
        try:
            self.model_kwargs.model_validate(dict(raw or {}))
        except ValidationError as exc:
            return kwargs_problems(self, exc)
        return []


def knob_names(kwargs: type[ArchKwargs]) -> tuple[str, ...]:
    return tuple(kwargs.model_fields)


def kwargs_problems(desc: ArchDescription, exc: ValidationError) -> list[str]:
    valid = ", ".join(knob_names(desc.model_kwargs)) or "none"
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in ("model", "model_kwargs", *err["loc"]))
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: not a knob of arch {desc.name}; its model_kwargs: {valid}")
        elif err["type"] == "value_error":  # a validator's own sentence
            lines.append(f"{where}: {err['ctx']['error']}")
        else:
            lines.append(f"{where}: {err['msg']}")
    return lines


def minimal_description(cls: type) -> ArchDescription:
    """An extension class without a `description`: its name and class, all else unknown."""
    doc = (cls.__doc__ or "").strip().splitlines()
    return ArchDescription(name=str(getattr(cls, "arch", "")),
                           summary=doc[0] if doc else "",
                           model_class=f"{cls.__module__}:{cls.__qualname__}")
