"""Job configs from the page: YAML text -> the trainer's own schema and preflight, with
every problem as {path, message} so the page can show it at its field.

The schema is aitk.config.loading.parse_job (the same code `run.py` runs); the preflight adds
what the trainer would refuse at start and the page can tell now: a dataset folder or a
model folder that does not exist, and a job that would write into another job's output
folder. The arch is checked by the trainer itself at start (its registry imports torch,
which the server does not load); its problems come back through the status file.

Confinement (the guard's promise for what a job made here may do): it writes only under
the outputs root (its output folder, and a tiny model `create_if_missing` builds), and
`${VAR}` is never filled in, here or by the trainer later, so a config cannot read the
server's environment (a `${...}` is a field error that names no value).

Every job kind runs here. A training job's folder is `training_folder/NAME`; a file
job's (extract, mod, merge, generate) is the folder its config names for its first
output (`JobBase.output_dir`), which must lie inside the outputs root, and every other
key that names an output (`file_outputs`) must lie inside that folder. Keys that name
inputs (the models, LoRAs and prompt files a job reads) may point anywhere the trainer
can read: reading is what the job is for.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aitk.config.kinds import FILE_KINDS, TRAINING_KINDS
from aitk.config.loading import LoadedConfig, parse_job
from aitk.errors import ConfigError
from aitk_common import yamlload
from aitk_common.status import problem_fields
from aitk_common.yamlload import DocumentError, Limits

MAX_CONFIG_BYTES = 256 * 1024


@dataclass(frozen=True)
class Checked:
    loaded: LoadedConfig | None
    errors: list[dict[str, str]]
    warnings: list[str]


# The web form's rule over the one bounded loader (aitk_common.yamlload): a smaller
# text than a file may be, and no aliases at all (an alias bomb expands a few hundred
# bytes into gigabytes; a form never needs one).
FORM_LIMITS = Limits(max_bytes=MAX_CONFIG_BYTES, aliases=False)


def load_yaml(text: str) -> object:
    """The page's YAML as data; ValueError with one line when it is not a config."""
    try:
        return yamlload.load_yaml(text, FORM_LIMITS)
    except DocumentError as exc:
        raise ValueError(f"the config is {exc}" if exc.limit and "KiB" in str(exc)
                         else str(exc)) from None


# What the trainer would fill in from its environment (aitk.config.loading.substitute).
ENV_REFERENCE = re.compile(r"\$\{")


def env_references(raw: Any, path: str = "") -> list[dict[str, str]]:
    """Every string (or key) holding `${`: the web UI never fills those in."""
    found = []
    stack = [(raw, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and ENV_REFERENCE.search(key):
                    found.append(child)
                stack.append((item, child))
        elif isinstance(value, list):
            stack += [(item, f"{where}[{i}]") for i, item in enumerate(value)]
        elif isinstance(value, str) and ENV_REFERENCE.search(value):
            found.append(where)
    return [{"path": where, "message": "`${...}` is not filled in for jobs made in the web "
             "UI (it would read the server's environment); write the value itself"}
            for where in sorted(found)]


def within(path: Path, root: Path) -> bool:
    """`path` (symlinks followed, as far as it exists) lies inside `root`."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError, ValueError):
        return False


# The job kinds whose processes train into `training_folder/NAME` (LoRAs, full
# fine-tunes, both sliders), and the file jobs, which write where their config says
# (confined to their own folder: `file_outputs`).
WEB_UI_KINDS = TRAINING_KINDS + FILE_KINDS


def resolve(root: Path, value: str) -> Path:
    """Paths in a config are relative to the checkout: the trainer runs from there."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else root / path


def out_dir(loaded: LoadedConfig, root: Path) -> Path:
    """The job's folder: what the job list shows, the file route serves from, and what
    confinement keeps every output inside."""
    if loaded.kind in FILE_KINDS:
        return resolve(root, str(loaded.job.output_dir()))
    proc = loaded.job.config.process[0]
    return resolve(root, proc.training_folder) / loaded.name


def file_outputs(loaded: LoadedConfig) -> list[tuple[str, str]]:
    """(field, the path it writes) for every key of a file job that names an output
    (aitk.config.extract, mod, generate); the first is the job's folder. Generated
    images take names of their own inside `output_folder`; an extraction without
    `filename` / `output_path` writes into `output_folder` under the mode's name."""
    job, procs = loaded.job, loaded.job.config.process
    where = [f"config.process[{i}]" for i in range(len(procs))]
    if loaded.kind == "extract":
        folder = job.config.output_folder
        out = [("config.output_folder", folder)]
        for at, proc, target in zip(where, procs, job.targets(), strict=True):
            key = "output_path" if proc.output_path else "filename" if proc.filename \
                else None
            if key:
                out.append((f"{at}.{key}", str(target)))
        return out
    if loaded.kind == "generate":
        return [(f"{at}.output_folder", p.output_folder) for at, p in zip(where, procs,
                                                                           strict=True)]
    return [(f"{at}.output_path", p.output_path) for at, p in zip(where, procs, strict=True)]


def models_built(loaded: LoadedConfig) -> list[tuple[str, Any]]:
    """(field, model config) of each model a job may build (`create_if_missing`)."""
    procs = loaded.job.config.process
    return [(f"config.process[{i}].model", p.model) for i, p in enumerate(procs)
            if getattr(p, "model", None) is not None]


def file_confinement(loaded: LoadedConfig, root: Path, outputs: Path
                     ) -> list[dict[str, str]]:
    """A file job writes only inside its own folder under the outputs root: each output
    path, resolved as the trainer will (links followed, `..` applied), stays there."""
    folder = out_dir(loaded, root)
    named = file_outputs(loaded)
    first = named[0][0]
    if not within(folder, outputs) or folder.resolve() == outputs.resolve():
        return [{"path": first, "message": f"jobs made in the web UI write only in a "
                 f"folder of their own under {outputs} (the outputs root; the server's "
                 f"--outputs-dir sets it), not {folder}"}]
    problems = [{"path": field, "message": f"{value} leads out of this job's folder "
                 f"{folder} (by .. or a link); a job made in the web UI writes only there"}
                for field, value in named[1:] if not within(resolve(root, value), folder)]
    return problems


def confinement(loaded: LoadedConfig, root: Path, outputs: Path) -> list[dict[str, str]]:
    """What a job made here would write outside the outputs root (a file job: outside
    its own folder there)."""
    if loaded.kind in FILE_KINDS:
        problems = file_confinement(loaded, root, outputs)
        for where, model in models_built(loaded):
            path = resolve(root, model.name_or_path)
            if model.create_if_missing and not path.exists() and not within(path, outputs):
                problems.append({"path": f"{where}.name_or_path", "message":
                                 f"create_if_missing would build a model outside the "
                                 f"outputs root {outputs}; build it under it, or point "
                                 "at a model"})
        return problems
    problems = []
    for i, proc in enumerate(loaded.job.config.process):
        where = f"config.process[{i}]"
        folder = resolve(root, proc.training_folder)
        if not within(folder, outputs):
            problems.append({"path": f"{where}.training_folder", "message":
                             f"jobs made in the web UI write only under {outputs} (the "
                             "outputs root; the server's --outputs-dir sets it)"})
        elif not within(folder / loaded.name, outputs):
            problems.append({"path": "config.name", "message": f"{folder / loaded.name} "
                             f"leads out of the outputs root {outputs} (a link)"})
        model = resolve(root, proc.model.name_or_path)
        if proc.model.create_if_missing and not model.exists() and not within(model, outputs):
            problems.append({"path": f"{where}.model.name_or_path", "message":
                             f"create_if_missing would build a model outside the outputs "
                             f"root {outputs}; build it under it, or point at a model"})
    return problems


def preflight(loaded: LoadedConfig, root: Path) -> list[dict[str, str]]:
    """A training job's dataset and model folders; a file job's inputs are the
    trainer's own check (aitk.audit.file_jobs, through `run.py --check`)."""
    problems: list[dict[str, str]] = []
    if loaded.kind in FILE_KINDS:
        return problems
    for i, proc in enumerate(loaded.job.config.process):
        where = f"config.process[{i}]"
        for j, ds in enumerate(proc.datasets):
            if not resolve(root, ds.folder_path).is_dir():
                problems.append({"path": f"{where}.datasets[{j}].folder_path",
                                 "message": f"dataset folder {ds.folder_path} does not exist"})
        model = resolve(root, proc.model.name_or_path)
        looks_local = proc.model.name_or_path.startswith((".", "/", "~")) or \
            model.parent.is_dir() and model.parent != root
        if not model.exists() and not proc.model.create_if_missing and looks_local:
            problems.append({"path": f"{where}.model.name_or_path",
                             "message": f"model folder {proc.model.name_or_path} does not exist"})
    return problems


def check(text: str, root: Path, outputs: Path,
          taken: dict[Path, str] | None = None) -> Checked:
    """`outputs`: the outputs root; `taken`: output folders of other jobs -> their names."""
    try:
        raw = load_yaml(text)
    except ValueError as exc:
        return Checked(None, [{"path": "", "message": str(exc)}], [])
    refused = env_references(raw)
    if refused:
        return Checked(None, refused, [])
    try:
        loaded = parse_job(raw, "<web ui>", env={}, check_arch=None)
    except ConfigError as exc:
        return Checked(None, problem_fields(exc.problems), [])
    if loaded.kind not in WEB_UI_KINDS:
        return Checked(None, [{"path": "job", "message": f"the web UI runs the job kinds "
                               f"{', '.join(WEB_UI_KINDS)}; run this job: {loaded.kind} "
                               "with `run.py CONFIG` (docs/jobs.md)"}], [])
    errors = confinement(loaded, root, outputs) + preflight(loaded, root)
    target = out_dir(loaded, root).resolve()
    other = (taken or {}).get(target)
    if other is not None:
        errors.append({"path": "config.name", "message": f"job {other!r} already writes to "
                       f"{target}; choose another name"})
    return Checked(loaded if not errors else None, errors, loaded.warnings)


def parse_stored(text: str) -> LoadedConfig:
    """A stored job's config, parsed as it was accepted (no `${VAR}` filled in);
    ValueError when it no longer parses."""
    try:
        return parse_job(load_yaml(text), "<web ui>", env={}, check_arch=None)
    except ConfigError as exc:
        raise ValueError(exc.problems[0]) from None


def examples(folder: Path) -> dict[str, str]:
    """Example configs shipped with the checkout: name -> YAML text."""
    found = {}
    for path in sorted(folder.glob("*.y*ml")) if folder.is_dir() else []:
        try:
            found[path.stem] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return found


def with_name(text: str, name: str) -> str:
    """The example's YAML with `config.name` replaced (comments elsewhere kept)."""
    lines = text.splitlines(keepends=True)
    in_config = False
    for i, line in enumerate(lines):
        if line.startswith("config:"):
            in_config = True
        elif in_config and line.lstrip().startswith("name:") and line.startswith("  ") \
                and not line.startswith("   "):
            lines[i] = f"  name: {yaml.safe_dump(name, default_style=None).splitlines()[0]}\n"
            break
    return "".join(lines)
