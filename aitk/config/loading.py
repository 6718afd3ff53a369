"""`load_config`: a job config file -> a validated `LoadedConfig`, every problem at once.

It resolves the file like upstream (`config/NAME` with or without an extension, or a
path), reads it bounded (size, node count with aliases expanded, depth), replaces
`[name]` and `${VAR}`, screens upstream's keys (aitk.config.upstream) and validates
against the schema (aitk.config.schema) in one pass. Every problem is collected, so a
user fixes a config in one round:

- a wrong type or value names the field path and what was expected;
- an unknown key is an error that suggests the nearest valid key;
- a key that upstream accepts but aitk does not support is a warning naming it (and
  is dropped), so configs written for upstream keep working where that is safe;
- an unknown `model.arch` lists the archs the registry knows (and any extension that
  failed to import).

All of these raise `ConfigError`, which the entry points turn into exit code 2.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aitk.config import kinds, upstream_keys
from aitk.config.schema import JobBase, join_path, validation_problems
from aitk.config.upstream import ArchDetector, processes, refusal, screen_keys, upstream_form
from aitk.errors import ConfigError
from aitk_common import yamlload

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_EXTENSIONS = ("", ".yml", ".yaml", ".json")


@dataclass
class LoadedConfig:
    """A validated job plus what the run needs to record it."""

    job: JobBase  # one of aitk.config.kinds.SCHEMAS
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
        return self.job.name

    @property
    def kind(self) -> str:
        """The `job:` value: extension, train, extract, mod, merge or generate."""
        return str(self.job.job)


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


def read_config_file(path: Path) -> Any:
    """The file's data: read bounded (aitk_common.yamlload: size, values with aliases
    expanded, depth), JSON for a .json file, YAML otherwise."""
    limit = yamlload.DEFAULT.max_bytes
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(str(path), [f"larger than {limit // 1024} KiB; not a job "
                                          "config"])
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not a UTF-8 text file ({exc.reason} at byte "
                                      f"{exc.start})"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the file ({exc.strerror or exc})"]
                          ) from None
    if path.suffix == ".json":
        return _bounded(yamlload.load_json, text, str(path))
    return _bounded(yamlload.load_yaml, text, str(path))


def load_yaml(text: str, source: str) -> Any:
    """YAML text (a file's, or the web form's) as job config data, read within the
    limits of aitk_common.yamlload; ConfigError naming `source` when it is not."""
    return _bounded(yamlload.load_yaml, text, source)


def _bounded(load: Callable[[str], Any], text: str, source: str) -> Any:
    try:
        return load(text)
    except yamlload.DocumentError as exc:
        raise ConfigError(source, [f"{exc}; not a job config" if exc.limit else str(exc)]
                          ) from None


# ---- substitution ---------------------------------------------------------------------
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(raw: Any, name: str, env: typing.Mapping[str, str] | None,
               problems: list[str], path: str = "") -> Any:
    """Replace `[name]` and `${VAR}` in every string; a missing variable is a problem.
    With env=None only `[name]` is replaced (the form outputs record)."""
    if isinstance(raw, dict):
        return {k: substitute(v, name, env, problems, join_path(path, k)) for k, v in raw.items()}
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


def parse_job(raw: Any, source: str, *, name_override: str | None = None,
              env: typing.Mapping[str, str] | None = None,
              check_arch: ArchCheck | None = None,
              detect_arch: ArchDetector | None = None) -> LoadedConfig:
    """Pure core of `load_config`: raw data -> validated config of its job kind
    (aitk.config.kinds), all problems at once. A job aitk does not run, or an upstream
    arch it does not support yet, stops with that one line. `detect_arch` reads the arch
    of a model folder a config names without saying which it is."""
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
    data = upstream_form(substitute(raw, str(job_name or "[name]"), env, problems),
                         detect_arch)
    if check_arch is not None:
        found = arch_problems(data, check_arch)
        stop = [p for p, arch in found if arch in upstream_keys.UPSTREAM_ARCHS]
        if stop:
            raise ConfigError(source, stop[:1])
        problems += [p for p, _ in found]
    written = data
    schema = kinds.schema_for(data.get("job", kinds.DEFAULT_JOB))
    assert schema is not None  # refusal() named any other kind
    data = screen_keys(data, schema, "", problems, warnings)
    job: JobBase | None = None
    try:
        job = schema.model_validate(data)
    except ValidationError as exc:
        problems += validation_problems(exc, data)
    if job is not None:
        from aitk.config.archfit import arch_fit_problems

        problems += arch_fit_problems(job)
    if problems:
        raise ConfigError(source, problems)
    assert job is not None
    recorded = screen_keys(upstream_form(substitute(raw, str(job_name), None, []),
                                         detect_arch), schema, "", [], [])
    return LoadedConfig(job=job, raw=data, source=Path(source), warnings=warnings,
                        recorded=recorded, written=written)


ArchCheck = Callable[[str], "str | None"]  # arch -> problem text, None when known


def arch_problems(data: Any, check_arch: ArchCheck) -> list[tuple[str, str]]:
    """(problem, arch) for each `model.arch` (an extract job's `config.arch`) the checker
    does not know; its text lists the known archs."""
    places = []
    section = data.get("config") if isinstance(data, dict) else None
    if isinstance(section, dict) and data.get("job") == "extract":
        places.append(("config.arch", section.get("arch")))
    for i, proc in enumerate(processes(data)):
        model = proc.get("model") if isinstance(proc, dict) else None
        places.append((f"config.process[{i}].model.arch",
                       model.get("arch") if isinstance(model, dict) else None))
    out = []
    for where, arch in places:
        if isinstance(arch, str):
            problem = check_arch(arch)
            if problem is not None:
                out.append((f"{where}: {problem}", arch))
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


def folder_arch(location: str) -> str | None:
    """The arch of a local model folder (aitk.models.detect); torch-free."""
    from aitk.models.detect import detect_arch

    return detect_arch(Path(location).expanduser())


def load_config(name_or_path: str, *, name_override: str | None = None,
                env: typing.Mapping[str, str] | None = None,
                check_arch: ArchCheck | None = registry_arch_check,
                detect_arch: ArchDetector | None = folder_arch) -> LoadedConfig:
    path = resolve_config_path(name_or_path)
    return parse_job(read_config_file(path), str(path), name_override=name_override,
                     env=env, check_arch=check_arch, detect_arch=detect_arch)


def dump_yaml(raw: dict[str, Any]) -> str:
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
