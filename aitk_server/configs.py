"""Job configs from the page: YAML text -> the trainer's own schema and preflight, with
every problem as {path, message} so the page can show it at its field.

The schema is aitk.config.parse_job (the same code `run.py` runs); the preflight adds
what the trainer would refuse at start and the page can tell now: a dataset folder or a
model folder that does not exist, and a job that would write into another job's output
folder. The arch is checked by the trainer itself at start (its registry imports torch,
which the server does not load); its problems come back through the status file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from aitk.config import ConfigError, LoadedConfig, parse_job
from aitk.status import problem_fields

MAX_CONFIG_BYTES = 256 * 1024


@dataclass(frozen=True)
class Checked:
    loaded: LoadedConfig | None
    errors: list[dict[str, str]]
    warnings: list[str]


def load_yaml(text: str) -> object:
    """Bounded parse: YAML aliases are refused (an alias bomb expands a few hundred bytes
    into gigabytes), and so is an oversized text."""
    if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
        raise ValueError(f"the config is larger than {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        if any(isinstance(t, yaml.AliasToken) for t in yaml.scan(text)):
            raise ValueError("YAML aliases (*name) are not accepted here; write the values out")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {' '.join(str(exc).split())}") from None


def resolve(root: Path, value: str) -> Path:
    """Paths in a config are relative to the checkout: the trainer runs from there."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else root / path


def out_dir(loaded: LoadedConfig, root: Path) -> Path:
    proc = loaded.job.config.process[0]
    return resolve(root, proc.training_folder) / loaded.name


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


def check(text: str, root: Path, taken: dict[Path, str] | None = None) -> Checked:
    """`taken`: output folders of other jobs -> their names."""
    try:
        raw = load_yaml(text)
    except ValueError as exc:
        return Checked(None, [{"path": "", "message": str(exc)}], [])
    try:
        loaded = parse_job(raw, "<web ui>", check_arch=None)
    except ConfigError as exc:
        return Checked(None, problem_fields(exc.problems), [])
    errors = preflight(loaded, root)
    target = out_dir(loaded, root).resolve()
    other = (taken or {}).get(target)
    if other is not None:
        errors.append({"path": "config.name", "message": f"job {other!r} already writes to "
                       f"{target}; choose another name"})
    return Checked(loaded if not errors else None, errors, loaded.warnings)


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
