"""Upstream's format, screened before validation: what aitk refuses, what it derives,
and which keys it drops.

- `refusal`: a job aitk does not run at all (another job or process type, a full
  fine-tune) is one line, not a list of the keys that belong to it;
- `upstream_form`: upstream's derivations (`model.arch` from the `is_*` flags or with
  its `:tag` dropped, the tagged variant's defaults, `locon` is a LoRA, `training_seed`);
- `screen_keys`: a key upstream accepts but aitk does not act on is dropped (a warning,
  once, when its value would change what upstream does); any other unknown key is an
  error suggesting the nearest valid one.

The tables are data in aitk.config.upstream_keys.
"""

from __future__ import annotations

import copy
import difflib
import typing
from typing import Any

from pydantic import BaseModel

from aitk.config import upstream_keys
from aitk.config.schema import SECTION_NAMES, join_path


def processes(data: Any) -> list[Any]:
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
    for i, proc in enumerate(processes(data)):
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
    flags (or with its `:tag` dropped, `flex1` -> `flux`; a tag naming a variant fills in
    that variant's defaults), a `locon` network is a LoRA (with its `network.conv` rank
    on the conv layers), and `training_seed` (process or
    config level) seeds the run when `train.seed` is not set."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    section = data.get("config") if isinstance(data.get("config"), dict) else {}
    for proc in processes(data):
        if not isinstance(proc, dict):
            continue
        model = proc.get("model")
        if isinstance(model, dict) and isinstance(model.get("arch"), str | None):
            tag = upstream_keys.arch_tag(model)
            model["arch"] = upstream_keys.derive_arch(model)  # any other type: a schema error
            if tag is not None:
                apply_tag_defaults(proc, model["arch"], tag)
        network = proc.get("network")
        if isinstance(network, dict) and network.get("type") == "locon":
            network["type"] = "lora"
        seed = proc.pop("training_seed", section.get("training_seed"))
        train = proc.setdefault("train", {})
        if seed is not None and isinstance(train, dict) and "seed" not in train:
            train["seed"] = seed
    section.pop("training_seed", None)
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
        where = join_path(path, key)
        if key in fields:
            nested = _nested_model(fields[key].annotation)
            kept[key] = (screen_keys(value, nested, where, problems, warnings, warned)
                         if nested is not None else value)
        elif key in upstream:
            name = f"{section}.{key}"
            if upstream_keys.changes_behaviour(section, key, value, raw) and \
                    name not in warned:
                warned.add(name)
                instead = upstream_keys.INSTEAD.get((section, key))
                warnings.append(f"{where}: {instead}" if instead else
                                f"{where}: valid upstream but not supported by aitk; "
                                "ignored")
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
