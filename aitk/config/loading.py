"""Job config: the upstream YAML format as a typed schema, and `load_config`.

    job: extension
    config:
      name: my_lora
      process:
        - type: sd_trainer
          training_folder: output
          network: {type: lora, linear: 16, linear_alpha: 16}
          save / sample / train / model / datasets: ...
    meta: {name: "[name]", version: "1.0"}

`load_config` resolves the file like upstream (`config/NAME` with or without an
extension, or a path), replaces `[name]` and `${VAR}`, and validates everything in one
pass. Every problem is collected, so a user fixes a config in one round:

- a wrong type or value names the field path and what was expected;
- an unknown key is an error that suggests the nearest valid key;
- a key that upstream accepts but aitk does not support is a warning naming it (and
  is dropped), so configs written for upstream keep working where that is safe;
- an unknown `model.arch` lists the archs the registry knows (and any extension that
  failed to import).

All of these raise `ConfigError`, which the entry points turn into exit code 2.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from aitk.config import upstream_keys
from aitk.config.choices import QTYPES, TIMESTEP_TYPES

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_EXTENSIONS = ("", ".yml", ".yaml", ".json")


class ConfigError(Exception):
    """A config that cannot run. `problems` holds one line per problem; `records` the
    same as (field path, message) pairs ("" when a problem is about no one field), for
    callers that place the message next to the field (audits, a web form)."""

    exit_code = 2

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    @property
    def records(self) -> list[tuple[str, str]]:
        return [split_problem(p) for p in self.problems]

    def render(self) -> str:
        if len(self.problems) == 1:
            return f"config error in {self.source}: {self.problems[0]}"
        lines = [f"config errors in {self.source}:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


_PATH_PREFIX = re.compile(r"^((?:config|job|meta)(?:\.[\w-]+|\[\d+\])*|\(top level\)): ")


def split_problem(problem: str) -> tuple[str, str]:
    """"config.process[0].train.lr: too small" -> ("config.process[0].train.lr", "too
    small"); a problem about no one field has the path ""."""
    found = _PATH_PREFIX.match(problem)
    if found is None:
        return "", problem
    return found.group(1), problem[found.end():]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


PositiveInt = Annotated[int, Field(ge=1)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class NetworkKwargs(_Strict):
    only_if_contains: list[str] | None = None
    ignore_if_contains: list[str] | None = None


class NetworkConfig(_Strict):
    type: Literal["lora", "lokr"] = "lora"
    linear: PositiveInt | None = None
    rank: PositiveInt | None = None  # upstream's older name for `linear`
    linear_alpha: float | None = None
    alpha: float | None = None
    dropout: Probability | None = None
    lokr_factor: int = -1
    network_kwargs: NetworkKwargs = NetworkKwargs()

    @property
    def dim(self) -> int:
        return self.linear or self.rank or 16

    @property
    def scale_alpha(self) -> float:
        for value in (self.linear_alpha, self.alpha):
            if value is not None:
                return float(value)
        return float(self.dim)


class SaveConfig(_Strict):
    dtype: Literal["float16", "fp16", "bfloat16", "bf16", "float32", "fp32"] = "float16"
    save_every: PositiveInt = 250
    max_step_saves_to_keep: PositiveInt = 4
    # upstream writes "diffusers" for flux; aitk always writes the layout the arch's
    # loaders read (see aitk.adapters.keys), so both are accepted
    save_format: Literal["safetensors", "diffusers"] = "safetensors"


class SampleItem(_Strict):
    prompt: str
    width: PositiveInt | None = None
    height: PositiveInt | None = None
    neg: str | None = None
    seed: int | None = None
    guidance_scale: float | None = None
    sample_steps: PositiveInt | None = None
    num_frames: PositiveInt | None = None  # video archs; unset: the sample section's
    fps: PositiveInt | None = None
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
    width: PositiveInt = 512
    height: PositiveInt = 512
    prompts: list[str] = []
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

    @property
    def items(self) -> list[SampleItem]:
        """`samples` wins over the legacy `prompts` list, as upstream."""
        if self.samples is not None:
            return list(self.samples)
        return [SampleItem(prompt=p) for p in self.prompts]


class OptimizerParams(_Strict):
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


class LRSchedulerParams(_Strict):
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    eta_min: Annotated[float, Field(ge=0.0)] = 0.0  # floor of linear/cosine decay


class TrainConfig(_Strict):
    steps: PositiveInt = 1000
    batch_size: PositiveInt = 1
    gradient_accumulation: PositiveInt = 1
    gradient_accumulation_steps: PositiveInt = 1  # upstream's legacy name
    lr: Annotated[float, Field(gt=0.0)] = 1e-4
    optimizer: Literal["adamw", "adamw8bit"] = "adamw"
    optimizer_params: OptimizerParams = OptimizerParams()
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant"
    lr_scheduler_params: LRSchedulerParams = LRSchedulerParams()
    max_grad_norm: Annotated[float, Field(ge=0.0)] = 1.0
    dtype: Literal["fp32", "float32", "bf16", "bfloat16"] = "fp32"
    noise_scheduler: Literal["flowmatch"] = "flowmatch"
    timestep_type: Literal[TIMESTEP_TYPES] = "sigmoid"  # type: ignore[valid-type]
    noise_offset: Annotated[float, Field(ge=0.0)] = 0.0
    min_snr_gamma: Annotated[float, Field(gt=0.0)] | None = None  # DDPM archs (SDXL)
    # Flux: the value fed to a guidance-distilled model's guidance embedding.
    cfg_scale: float = 1.0
    bypass_guidance_embedding: bool = False
    # Multi-expert models (wan22_14b): train one expert for this many micro-batches,
    # then the other (upstream's key).
    switch_boundary_every: PositiveInt = 1
    loss_type: Literal["mse"] = "mse"
    gradient_checkpointing: bool = True
    cache_text_embeddings: bool = False
    unload_text_encoder: bool = False  # aitk: same as cache_text_embeddings
    skip_first_sample: bool = False
    disable_sampling: bool = False
    seed: int = 42

    @model_validator(mode="after")
    def _one_accumulation_key(self) -> TrainConfig:
        if self.gradient_accumulation > 1 and self.gradient_accumulation_steps > 1:
            raise ValueError("set gradient_accumulation or gradient_accumulation_steps, "
                             "not both")
        return self

    @property
    def accumulation(self) -> int:
        return max(self.gradient_accumulation, self.gradient_accumulation_steps)


class ModelConfig(_Strict):
    name_or_path: str
    arch: str
    quantize: bool = False
    quantize_te: bool | None = None
    qtype: Literal[QTYPES] = "qfloat8"  # type: ignore[valid-type]
    qtype_te: Literal[QTYPES] = "qfloat8"  # type: ignore[valid-type]
    low_vram: bool = False  # keep idle parts (text encoders, VAE) on the CPU
    assistant_lora_path: str | None = None  # Flux schnell: the de-distillation LoRA
    # DDPM archs (sdxl): true = v-prediction, false = epsilon; unset = the model's
    # scheduler config says.
    is_v_pred: bool | None = None
    model_kwargs: dict[str, Any] = {}
    # aitk: build the arch's tiny random model (BaseModel.build_tiny) at name_or_path
    # when it is absent, so the tiny example jobs run on a fresh checkout.
    create_if_missing: bool = False

    @model_validator(mode="after")
    def _te_follows_quantize(self) -> ModelConfig:
        if self.quantize_te is None:
            self.quantize_te = self.quantize
        return self


def four_k_plus_one(frames: int) -> int:
    """Frame counts are 1 or 4k+1: video VAEs (Wan's) keep the first frame and pack
    each further 4 frames into one latent frame."""
    if frames < 1 or (frames - 1) % 4:
        below = max(1, (frames - 1) // 4 * 4 + 1)
        raise ValueError(f"must be 1 or of the form 4k+1 (1, 5, 9, 13, 17, ..., 81); got "
                         f"{frames}: use {below} or {below + 4}")
    return frames


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
    num_frames: Annotated[int, AfterValidator(four_k_plus_one)] = 1
    fps: PositiveInt = 24  # with shrink_video_to_frames false: the rate frames are taken at
    shrink_video_to_frames: bool = True  # spread num_frames over the whole clip
    # Edit models: folders of control images paired with the images by file stem
    # (a list for several references; `control_path_1..3` are upstream's other names).
    control_path: str | list[str] | None = None
    control_path_1: str | None = None
    control_path_2: str | None = None
    control_path_3: str | None = None

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


class ProcessConfig(_Strict):
    type: Literal["sd_trainer", "ui_trainer", "diffusion_trainer"] = "sd_trainer"
    training_folder: str = "output"
    device: str | None = None  # None: cuda when available, else cpu
    gpus: PositiveInt = 1  # > 1: run.py starts torchrun (aitk.run.torchrun)
    trigger_word: str | None = None
    network: NetworkConfig
    save: SaveConfig = SaveConfig()
    sample: SampleConfig = SampleConfig()
    train: TrainConfig = TrainConfig()
    model: ModelConfig
    datasets: Annotated[list[DatasetConfig], Field(min_length=1)]


def one_path_component(name: str) -> str:
    """The job name becomes a folder and file names: one plain path component."""
    if name in (".", "..") or any(c in name for c in "/\\\0") or Path(name).is_absolute():
        raise ValueError(f"must be one folder name (no '/', '\\', '..' or absolute path; "
                         f"got {name!r}): it names the output folder and its files")
    return name


class JobSection(_Strict):
    name: Annotated[str, Field(min_length=1), AfterValidator(one_path_component)]
    process: Annotated[list[ProcessConfig], Field(min_length=1)]


class JobConfig(_Strict):
    job: Literal["extension"] = "extension"
    config: JobSection
    meta: dict[str, Any] = {}


# Each schema class is the aitk side of one upstream section (aitk.config.upstream_keys).
SECTION_NAMES: dict[type[BaseModel], str] = {
    JobConfig: "job", JobSection: "config", ProcessConfig: "process",
    NetworkConfig: "network", NetworkKwargs: "network.network_kwargs", SaveConfig: "save",
    SampleConfig: "sample", SampleItem: "sample.samples", TrainConfig: "train",
    OptimizerParams: "train.optimizer_params",
    LRSchedulerParams: "train.lr_scheduler_params", ModelConfig: "model",
    DatasetConfig: "datasets",
}


@dataclass
class LoadedConfig:
    """A validated job plus what the run needs to record it."""

    job: JobConfig
    raw: dict[str, Any]  # after [name]/${VAR} substitution, unsupported keys dropped
    source: Path
    warnings: list[str] = field(default_factory=list)
    # What outputs record (config.yaml, LoRA metadata): like `raw`, but `${VAR}` kept as
    # written, so a token passed through the environment is never saved to disk.
    recorded: dict[str, Any] = field(default_factory=dict)
    # As written (after substitution and upstream's derivations), keys aitk ignores
    # included: audits read upstream-only settings (control_path, shuffle_tokens) here.
    written: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.job.config.name


# ---- file resolution ------------------------------------------------------------------
def resolve_config_path(name: str, cwd: Path | None = None) -> Path:
    """A path, or a name under `config/` with or without .yml/.yaml/.json (upstream)."""
    cwd = cwd or Path.cwd()
    bases = [Path(name)]
    if not Path(name).is_absolute():
        bases += [cwd / "config" / name, REPO_ROOT / "config" / name]
    for base in bases:
        for ext in CONFIG_EXTENSIONS:
            candidate = base.with_name(base.name + ext) if ext else base
            if candidate.is_file():
                return candidate
    raise ConfigError(name, ["no such config file (looked for it as a path and under "
                             "config/, with and without .yml/.yaml/.json)"])


# Configs are a few KB; these limits only stop a hostile or broken file (a 1 KB YAML
# "billion laughs" expands to 10**9 nodes) from eating memory and time.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000
MAX_CONFIG_DEPTH = 64


def _check_shape(root: Any, children: Callable[[Any], list[Any]], source: str) -> None:
    """ConfigError when the document, with every alias expanded, has too many values (a
    self-referencing alias counts without end, so it stops here too) or nests too deep
    for the recursive steps after it. Iterative: bounded time, no recursion."""
    seen, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_NODES:
            raise ConfigError(source, [f"too large once its aliases are expanded (more "
                                       f"than {MAX_CONFIG_NODES} values); not a job config"])
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(source, [f"nested more than {MAX_CONFIG_DEPTH} levels deep; "
                                       "not a job config"])
        stack += [(child, depth + 1) for child in children(node)]


def _yaml_children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _data_children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    return list(value) if isinstance(value, list) else []


def load_yaml(text: str, source: str) -> Any:
    """yaml.safe_load in bounded time and memory (see _count_nodes)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_shape(node, _yaml_children, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_config_file(path: Path) -> Any:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(str(path), [f"larger than {MAX_CONFIG_BYTES // 1024} KiB; "
                                          "not a job config"])
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not a UTF-8 text file ({exc.reason} at byte "
                                      f"{exc.start})"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the file ({exc.strerror or exc})"]
                          ) from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
            _check_shape(data, _data_children, str(path))
            return data
        return load_yaml(text, str(path))
    except RecursionError:
        raise ConfigError(str(path), ["nested too deeply to be a job config"]) from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(str(path), [parse_error_line(exc, path)]) from None


def parse_error_line(exc: Exception, path: Path) -> str:
    """One line with the line and column (1-based) where parsing failed."""
    kind = "JSON" if path.suffix == ".json" else "YAML"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    if mark is None:
        return f"not valid {kind}: {problem}"
    return f"not valid {kind} at line {mark.line + 1}, column {mark.column + 1}: {problem}"


# ---- substitution ---------------------------------------------------------------------
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(raw: Any, name: str, env: typing.Mapping[str, str] | None,
               problems: list[str], path: str = "") -> Any:
    """Replace `[name]` and `${VAR}` in every string; a missing variable is a problem.
    With env=None only `[name]` is replaced (the form outputs record)."""
    if isinstance(raw, dict):
        return {k: substitute(v, name, env, problems, _join(path, k)) for k, v in raw.items()}
    if isinstance(raw, list):
        return [substitute(v, name, env, problems, f"{path}[{i}]") for i, v in enumerate(raw)]
    if not isinstance(raw, str):
        return raw
    if env is None:
        return raw.replace("[name]", name)

    def env_value(match: re.Match[str]) -> str:
        var = match.group(1)
        if var not in env:
            problems.append(f"{path}: environment variable {var} is not set")
            return match.group(0)
        return env[var]

    return _ENV.sub(env_value, raw.replace("[name]", name))


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


# ---- unknown and upstream-only keys ---------------------------------------------------
def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None`, `list[X]`, `Annotated[list[X], ...]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def screen_keys(raw: Any, model: type[BaseModel], path: str,
                problems: list[str], warnings: list[str],
                warned: set[str] | None = None) -> Any:
    """Drop upstream-only keys (a warning, once per key name, when the value changes
    upstream's behaviour); flag unknown ones (an error with a suggestion)."""
    warned = set() if warned is None else warned
    if isinstance(raw, list):
        return [screen_keys(v, model, f"{path}[{i}]", problems, warnings, warned)
                for i, v in enumerate(raw)]
    if not isinstance(raw, dict):
        return raw
    fields = model.model_fields
    section = SECTION_NAMES.get(model, "")
    upstream = upstream_keys.SECTIONS.get(section, {})
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        where = _join(path, key)
        if key in fields:
            nested = _nested_model(fields[key].annotation)
            kept[key] = (screen_keys(value, nested, where, problems, warnings, warned)
                         if nested is not None else value)
        elif key in upstream:
            name = f"{section}.{key}"
            if upstream_keys.changes_behaviour(section, key, value, raw) and \
                    name not in warned:
                warned.add(name)
                warnings.append(f"{where}: valid upstream but not supported by aitk; "
                                "ignored")
        else:
            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6) or \
                difflib.get_close_matches(str(key), list(upstream), n=1, cutoff=0.75)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            problems.append(f"{where}: unknown key{hint}")
    return kept


# ---- validation -----------------------------------------------------------------------
def _loc(loc: Iterable[Any], data: Any) -> str:
    """A pydantic location as a config path, skipping union-branch tags like `int`."""
    out = ""
    for part in loc:
        if isinstance(part, int) and isinstance(data, list) and part < len(data):
            out, data = f"{out}[{part}]", data[part]
        elif isinstance(part, str) and isinstance(data, dict) and part in data:
            out, data = _join(out, part), data[part]
        elif isinstance(part, str) and isinstance(data, dict | None) and \
                not any(c in part for c in "[-"):
            out, data = _join(out, part), None  # a missing key
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


def _processes(data: Any) -> list[Any]:
    section = data.get("config") if isinstance(data, dict) else None
    procs = section.get("process") if isinstance(section, dict) else None
    return procs if isinstance(procs, list) else []


def refusal(data: Any) -> str | None:
    """One line when the job is something aitk does not run at all (another job or process
    type, a full fine-tune): the keys that belong to it are not worth listing."""
    job = data.get("job", upstream_keys.RUN_JOB)
    runs = ", ".join(upstream_keys.RUN_PROCESS_TYPES)
    if job != upstream_keys.RUN_JOB:
        what = upstream_keys.OTHER_JOB_TYPES.get(str(job))
        kind = f" ({what})" if what else ""
        return (f"job: {job!r}{kind} is not supported by aitk; it runs `job: extension` "
                f"training processes ({runs})")
    for i, proc in enumerate(_processes(data)):
        if not isinstance(proc, dict):
            continue
        kind = proc.get("type", "sd_trainer")
        if kind not in upstream_keys.RUN_PROCESS_TYPES:
            what = upstream_keys.OTHER_PROCESS_TYPES.get(str(kind))
            detail = f" ({what})" if what else ""
            return (f"config.process[{i}].type: process type {kind!r}{detail} is not "
                    f"supported by aitk; it runs {runs}")
        if proc.get("network") is None and "model" in proc:
            return (f"config.process[{i}]: a full fine-tune (no `network` section) is not "
                    "supported by aitk; add a `network` (type lora or lokr) to train an "
                    "adapter")
    return None


def upstream_form(data: Any) -> Any:
    """Upstream's derivations, applied before validation: `model.arch` from the `is_*`
    flags (or with its `:tag` dropped, `flex1` -> `flux`), a `locon` network is a LoRA
    (its conv part is warned about as `network.conv`), and `training_seed` (process or
    config level) seeds the run when `train.seed` is not set."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    section = data.get("config") if isinstance(data.get("config"), dict) else {}
    for proc in _processes(data):
        if not isinstance(proc, dict):
            continue
        model = proc.get("model")
        if isinstance(model, dict) and isinstance(model.get("arch"), str | None):
            model["arch"] = upstream_keys.derive_arch(model)  # any other type: a schema error
        network = proc.get("network")
        if isinstance(network, dict) and network.get("type") == "locon":
            network["type"] = "lora"
        seed = proc.pop("training_seed", section.get("training_seed"))
        train = proc.setdefault("train", {})
        if seed is not None and isinstance(train, dict) and "seed" not in train:
            train["seed"] = seed
    section.pop("training_seed", None)
    return data


def parse_job(raw: Any, source: str, *, name_override: str | None = None,
              env: typing.Mapping[str, str] | None = None,
              check_arch: ArchCheck | None = None) -> LoadedConfig:
    """Pure core of `load_config`: raw data -> validated config, all problems at once.
    A job aitk does not run, or an upstream arch it does not support yet, stops with
    that one line."""
    env = os.environ if env is None else env
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the file must hold a mapping with `job` and `config`"])
    refused = refusal(raw)
    if refused is not None:
        raise ConfigError(source, [refused])
    problems: list[str] = []
    warnings: list[str] = []
    section = raw.get("config")
    if name_override is not None and isinstance(section, dict):
        # --name names the run (folder, files, [name]) even when the config has a name.
        raw = {**raw, "config": {**section, "name": name_override}}
        section = raw["config"]
    job_name = name_override or (section.get("name") if isinstance(section, dict) else None)
    data = upstream_form(substitute(raw, str(job_name or "[name]"), env, problems))
    if check_arch is not None:
        found = arch_problems(data, check_arch)
        stop = [p for p, arch in found if arch in upstream_keys.UPSTREAM_ARCHS]
        if stop:
            raise ConfigError(source, stop[:1])
        problems += [p for p, _ in found]
    written = data
    data = screen_keys(data, JobConfig, "", problems, warnings)
    job: JobConfig | None = None
    try:
        job = JobConfig.model_validate(data)
    except ValidationError as exc:
        problems += validation_problems(exc, data)
    if problems:
        raise ConfigError(source, problems)
    assert job is not None
    recorded = screen_keys(upstream_form(substitute(raw, str(job_name), None, [])),
                           JobConfig, "", [], [])
    return LoadedConfig(job=job, raw=data, source=Path(source), warnings=warnings,
                        recorded=recorded, written=written)


ArchCheck = Callable[[str], "str | None"]  # arch -> problem text, None when known


def arch_problems(data: Any, check_arch: ArchCheck) -> list[tuple[str, str]]:
    """(problem, arch) for each `model.arch` the checker does not know; its text lists
    the known archs."""
    out = []
    for i, proc in enumerate(_processes(data)):
        model = proc.get("model") if isinstance(proc, dict) else None
        arch = model.get("arch") if isinstance(model, dict) else None
        if isinstance(arch, str):
            problem = check_arch(arch)
            if problem is not None:
                out.append((f"config.process[{i}].model.arch: {problem}", arch))
    return out


def registry_arch_check(arch: str) -> str | None:
    """Known to aitk? The built-in archs are read without importing them; the registry
    (which imports torch) is asked only when extensions could add the arch."""
    from aitk.models import catalog

    known = catalog.builtin_archs()
    if arch in known:
        return None
    if catalog.has_extensions():
        from aitk.models import registry

        found = registry.discover()
        if arch in found.models:
            return None
        known = set(found.models)
        if arch not in upstream_keys.UPSTREAM_ARCHS:
            return str(registry.UnknownArchError(arch, found.models, found.broken))
    listed = ", ".join(sorted(known)) or "none"
    if arch in upstream_keys.UPSTREAM_ARCHS:
        return f"arch {arch!r} is not supported yet; supported: {listed}"
    return (f"unknown model arch {arch!r}; known archs: {listed} (`python -m aitk models` "
            "lists them with their source)")


def load_config(name_or_path: str, *, name_override: str | None = None,
                env: typing.Mapping[str, str] | None = None,
                check_arch: ArchCheck | None = registry_arch_check) -> LoadedConfig:
    path = resolve_config_path(name_or_path)
    return parse_job(read_config_file(path), str(path), name_override=name_override,
                     env=env, check_arch=check_arch)


def dump_yaml(raw: dict[str, Any]) -> str:
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)

