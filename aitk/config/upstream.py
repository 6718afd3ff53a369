"""Upstream's format, screened before validation: what aitk refuses, what it derives,
and which keys it drops.

- `refusal`: a job aitk does not run at all (an unknown job kind, a process type aitk
  lacks, an adapter or embedding trained instead of the model) is one line, not a list
  of the keys that belong to it;
- `upstream_form`: upstream's derivations (`model.arch` from the `is_*` flags or with
  its `:tag` dropped, the tagged variant's defaults, or, when none is set, from the
  model folder; `locon`/`lierla` are LoRAs; `training_seed`; a job-level
  `training_folder`/`device` for the processes);
- `screen_keys`: a key upstream accepts but aitk does not act on is dropped (a warning,
  once, when its value would change what upstream does); any other unknown key is an
  error suggesting the nearest valid one.

The tables are data in aitk.config.upstream_keys.
"""

from __future__ import annotations

import copy
import difflib
import typing
from collections.abc import Callable
from typing import Any

from pydantic import AliasChoices, BaseModel

from aitk.config import kinds, upstream_keys
from aitk.config.schema import join_path, model_for_type

# A model folder -> the arch it holds (None: cannot tell); aitk.models.detect.
ArchDetector = Callable[[str], "str | None"]


def processes(data: Any) -> list[Any]:
    section = data.get("config") if isinstance(data, dict) else None
    procs = section.get("process") if isinstance(section, dict) else None
    return procs if isinstance(procs, list) else []


def _job_of(data: Any) -> Any:
    return data.get("job", kinds.DEFAULT_JOB) if isinstance(data, dict) else None


def refusal(data: Any) -> str | None:
    """One line when the job is something aitk does not run at all (an unknown job kind,
    a process type aitk lacks, an adapter trained instead of the model): the keys that
    belong to it are not worth listing."""
    job = _job_of(data)
    if kinds.schema_for(job) is None:
        runs = ", ".join(kinds.SCHEMAS)
        return f"job: {job!r} is not a job kind aitk runs; it runs job: {runs}"
    types = kinds.PROCESS_TYPES[job]
    for i, proc in enumerate(processes(data)):
        if not isinstance(proc, dict):
            continue
        kind = proc.get("type", types[0] if job == kinds.DEFAULT_JOB else None)
        if kind not in types:
            return _process_refusal(i, job, kind, types)
        if job == kinds.DEFAULT_JOB and proc.get("network") is None:
            for key, what in upstream_keys.OTHER_TRAINED.items():
                section = proc.get(key)
                if section:
                    kind_of = section.get("type", "?") if isinstance(section, dict) else "?"
                    return (f"config.process[{i}].{key}: this process trains "
                            f"{what.format(type=kind_of)} instead of the model, which aitk "
                            "does not do; add a `network` to train a LoRA, or remove "
                            f"`{key}` for a full fine-tune")
    return None


def _process_refusal(i: int, job: str, kind: Any, types: tuple[str, ...]) -> str:
    where = f"config.process[{i}].type"
    if kind is None:
        return f"{where}: required key is missing (job: {job} runs {', '.join(types)})"
    elsewhere = [j for j, ts in kinds.PROCESS_TYPES.items() if kind in ts]
    if elsewhere:
        return (f"{where}: process type {kind!r} belongs to `job: {elsewhere[0]}`, not "
                f"`job: {job}` (which runs {', '.join(types)})")
    what = upstream_keys.OTHER_PROCESS_TYPES.get(str(kind))
    detail = f" ({what})" if what else ""
    return (f"{where}: process type {kind!r}{detail} is not supported by aitk; "
            f"`job: {job}` runs {', '.join(types)}")


def _arch(section: dict[str, Any], path_key: str, detect: ArchDetector | None) -> str:
    """`arch` as upstream derives it; with no `arch` and no `is_*` flag set, the arch the
    model folder holds when `detect` can tell (upstream would assume SD 1.x)."""
    flagged = section.get("arch") or any(section.get(f) for f, _ in upstream_keys.ARCH_FLAGS)
    location = section.get(path_key)
    if not flagged and detect is not None and isinstance(location, str):
        found = detect(location)
        if found:
            return found
    return upstream_keys.derive_arch(section)


def upstream_form(data: Any, detect: ArchDetector | None = None) -> Any:
    """Upstream's derivations, applied before validation: `model.arch` from the `is_*`
    flags (or with its `:tag` dropped, `flex1` -> `flux`; a tag naming a variant fills in
    that variant's defaults; with neither, from the model folder when `detect` can
    tell), `locon` and `lierla` networks are LoRAs (with a `network.conv` rank on the
    conv layers), `training_seed` (process or config level) seeds the run when
    `train.seed` is not set, and a job-level `training_folder` or `device` is each
    process's default (upstream's BaseJob passes them down)."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    job = _job_of(data)
    section = data.get("config") if isinstance(data.get("config"), dict) else {}
    if job == "extract" and isinstance(section, dict):
        if isinstance(section.get("arch"), str | None):
            section["arch"] = _arch(section, "base_model", detect)
    inherited = {"extension": ("training_folder", "device"),
                 "train": ("training_folder", "device"), "generate": ("device",)}
    for proc in processes(data):
        if not isinstance(proc, dict):
            continue
        for key in inherited.get(str(job), ()):
            if key in section and key not in proc:
                proc[key] = section[key]
        _model_forms(proc, detect)
        if job not in ("extension", "train"):
            continue
        network = proc.get("network")
        if isinstance(network, dict) and network.get("type") in ("locon", "lierla"):
            network["type"] = "lora"
        seed = proc.pop("training_seed", section.get("training_seed"))
        train = proc.setdefault("train", {})
        if seed is not None and isinstance(train, dict) and "seed" not in train:
            train["seed"] = seed
    for key in ("training_seed", *inherited.get(str(job), ())):
        section.pop(key, None)
    return data


def apply_tag_defaults(proc: dict[str, Any], arch: str, tag: str) -> None:
    """`arch: NAME:TAG` naming one of the arch's variants: that variant's `tag_defaults`
    (what upstream's web UI fills in for the choice: the training adapter of a turbo
    model, its sampling steps) go into the process where it leaves them unset. A tag
    that names no variant is dropped, as upstream's trainer drops every tag."""
    from aitk.errors import UnknownArchError
    from aitk.models import catalog

    try:
        variants = catalog.description(arch).variants
    except UnknownArchError:
        return  # reported by the arch check
    variant = next((v for v in variants if v.tag == tag), None)
    for path, value in variant.tag_defaults if variant else ():
        *sections, key = path.split(".")
        target: Any = proc
        for name in sections:
            target = target.setdefault(name, {}) if isinstance(target, dict) else None
        if isinstance(target, dict) and key not in target:
            target[key] = copy.deepcopy(value)


def _model_forms(proc: dict[str, Any], detect: ArchDetector | None) -> None:
    model = proc.get("model")
    if isinstance(model, dict) and isinstance(model.get("arch"), str | None):
        tag = upstream_keys.arch_tag(model)
        model["arch"] = _arch(model, "name_or_path", detect)  # any other type: an error
        if tag is not None:
            apply_tag_defaults(proc, model["arch"], tag)


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside `X`, `X | None`, `list[X]`, `Annotated[list[X], ...]`,
    or a union of several told apart by `type` (aitk.config.schema.by_type)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += [m for m in _nested_models(arg) if m not in found]
    return found


def _field_keys(model: type[BaseModel]) -> dict[str, str]:
    """Every key the model reads -> its field name (validation aliases included)."""
    keys = {name: name for name in model.model_fields}
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            keys.update({str(a): name for a in alias.choices if isinstance(a, str)})
    return keys


def screen_keys(raw: Any, model: type[BaseModel], path: str,
                problems: list[str], warnings: list[str],
                warned: set[str] | None = None) -> Any:
    """Drop upstream-only keys (a warning, once per key name, when the value changes
    upstream's behaviour); flag unknown ones (an error with a suggestion)."""
    return _screen(raw, [model], path, problems, warnings,
                   set() if warned is None else warned)


def _screen(raw: Any, models: list[type[BaseModel]], path: str, problems: list[str],
            warnings: list[str], warned: set[str]) -> Any:
    if isinstance(raw, list):
        return [_screen(v, models, f"{path}[{i}]", problems, warnings, warned)
                for i, v in enumerate(raw)]
    if not isinstance(raw, dict):
        return raw
    model = model_for_type(models, raw)
    fields = _field_keys(model)
    section = kinds.SECTIONS.get(model, "")
    upstream = upstream_keys.SECTIONS.get(section, {})
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        where = join_path(path, key)
        if key in fields:
            nested = _nested_models(model.model_fields[fields[key]].annotation)
            kept[key] = (_screen(value, nested, where, problems, warnings, warned)
                         if nested else value)
        elif key in upstream:
            name = f"{section}.{key}"
            if upstream_keys.changes_behaviour(section, key, value, raw) and \
                    name not in warned:
                warned.add(name)
                warnings.append(f"{where}: {upstream_keys.warning(section, key)}")
            if isinstance(value, dict) and key in upstream_keys.SECTIONS:
                # a section aitk drops whole (`logging`): its keys that matter still say so
                _instead(key, value, where, warnings, warned)
        else:
            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6) or \
                difflib.get_close_matches(str(key), list(upstream), n=1, cutoff=0.75)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            problems.append(f"{where}: unknown key{hint}")
    return kept


def _instead(section: str, raw: dict[str, Any], path: str, warnings: list[str],
             warned: set[str]) -> None:
    """The INSTEAD warnings of a dropped section's keys, once per key name."""
    for key, value in raw.items():
        name = f"{section}.{key}"
        instead = upstream_keys.INSTEAD.get((section, key))
        if instead and name not in warned and upstream_keys.changes_behaviour(
                section, key, value, raw):
            warned.add(name)
            warnings.append(f"{join_path(path, key)}: {instead}")
