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
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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
# fine-tunes, both sliders): what confinement and the job list know how to place. The
# file jobs (extract, mod, merge, generate) write where their config says.
WEB_UI_KINDS = ("extension", "train")


def resolve(root: Path, value: str) -> Path:
    """Paths in a config are relative to the checkout: the trainer runs from there."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else root / path


def out_dir(loaded: LoadedConfig, root: Path) -> Path:
    proc = loaded.job.config.process[0]
    return resolve(root, proc.training_folder) / loaded.name


def confinement(loaded: LoadedConfig, root: Path, outputs: Path) -> list[dict[str, str]]:
    """What a job made here would write outside the outputs root."""
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
    problems = []
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
        return Checked(None, [{"path": "job", "message": f"the web UI runs training jobs "
                               f"(job: {' or '.join(WEB_UI_KINDS)}); run this "
                               f"job: {loaded.kind} with `run.py CONFIG` (docs/jobs.md)"}], [])
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
