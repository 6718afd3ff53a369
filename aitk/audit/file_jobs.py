"""Preflight of the jobs that read and write model and LoRA files (extract, mod, merge,
generate): every input is there, every output can be written and is not someone else's
file, the device exists; all of it without loading a model (aitk.audit.preflight calls
this for those kinds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from aitk.audit.preflight import device_findings, looks_missing, model_findings, nearest_existing
from aitk.config.loading import LoadedConfig
from aitk.findings import Finding, error, warning


def _input_file(path: str, where: str, what: str) -> list[Finding]:
    target = Path(path).expanduser()
    if not target.is_file():
        return [error(where, f"{what} {path} does not exist", "point it at a .safetensors "
                      "file", "missing_input")]
    return []


def _lora_input(path: str, where: str) -> list[Finding]:
    found = _input_file(path, where, "LoRA file")
    if found:
        return found
    from aitk.adapters.lora_files import LoraFileError, read_layout

    try:
        read_layout(Path(path).expanduser())
    except LoraFileError as exc:
        return [error(where, str(exc), "point it at a LoRA file", "lora_input")]
    return []


def _model_input(location: str, where: str, what: str) -> list[Finding]:
    if looks_missing(location):
        return [error(where, f"{what} {location} does not exist", "point it at a model "
                      "folder, a safetensors file or a hub id (org/name)", "missing_input")]
    return []


def _output(target: Path, where: str, replaces: Iterable[Path] = (),
            is_ours: Callable[[Path], bool] | None = None) -> list[Finding]:
    """`target` can be written, and is ours (or absent) when it exists: anything else
    at that path is a user's file (an input named in `replaces` may be replaced, as the
    config asks)."""
    from aitk.run.ownership import lora_is_ours, model_folder_is_ours

    existing, writable = nearest_existing(target)
    if not writable and existing != target:
        return [error(where, f"{target} cannot be written ({existing} is not a writable "
                      "folder)", "point it somewhere writable", "output")]
    if not (target.exists() or target.is_symlink()):
        return []
    if any(target.resolve() == Path(r).expanduser().resolve() for r in replaces):
        return [warning(where, f"{target} is this process's input and will be replaced",
                        "write somewhere else to keep it", "replace_input")]
    ours = is_ours or (model_folder_is_ours if target.is_dir() else lora_is_ours)
    if not ours(target):
        return [error(where, f"{target} was not written by aitk and would be overwritten",
                      "move it away or choose another output path", "foreign_output")]
    return [warning(where, f"{target} exists (written by aitk) and will be replaced",
                    "choose another output path to keep it", "overwrite")]


def _duplicates(targets: list[Path], where: Callable[[int], str]) -> list[Finding]:
    seen: dict[Path, int] = {}
    out = []
    for i, target in enumerate(targets):
        key = target.resolve()
        if key in seen:
            out.append(error(where(i), f"writes {target}, as process {seen[key]} does",
                             "give each process its own output", "duplicate_output"))
        seen.setdefault(key, i)
    return out


def _extract(loaded: LoadedConfig) -> list[Finding]:
    cfg = loaded.job.config  # aitk.config.extract.ExtractSection
    out = device_findings("config.device", cfg.device)
    out += _model_input(cfg.base_model, "config.base_model", "base model")
    out += _model_input(cfg.extract_model, "config.extract_model", "model to extract")
    if Path(cfg.base_model).expanduser().resolve() == \
            Path(cfg.extract_model).expanduser().resolve():
        out.append(error("config.extract_model", "is the base model itself: there is no "
                         "difference to extract", "point it at the fine-tuned model",
                         "same_model"))
    targets = loaded.job.targets()
    for i, target in enumerate(targets):
        key = "output_path" if cfg.process[i].output_path else "filename"
        where = f"config.process[{i}].{key}" if cfg.process[i].output_path or \
            cfg.process[i].filename else "config.output_folder"
        out += _output(target, where)
    return out + _duplicates(targets, lambda i: f"config.process[{i}]")


def _mod(loaded: LoadedConfig) -> list[Finding]:
    out: list[Finding] = []
    for i, proc in enumerate(loaded.job.config.process):
        where = f"config.process[{i}]"
        out += _lora_input(proc.input_path, f"{where}.input_path")
        out += _output(Path(proc.output_path).expanduser(), f"{where}.output_path",
                       replaces=[Path(proc.input_path)])
    return out + _duplicates(loaded.job.targets(), lambda i: f"config.process[{i}]")


def _merge(loaded: LoadedConfig) -> list[Finding]:
    out = device_findings("config.device", loaded.job.config.device)
    for i, proc in enumerate(loaded.job.config.process):
        where = f"config.process[{i}]"
        inputs = []
        for j, lora in enumerate(proc.loras):
            found = _lora_input(lora.path, f"{where}.loras[{j}].path")
            out += found
            if not found:
                inputs.append((j, Path(lora.path).expanduser()))
        if proc.type == "merge_loras":
            out += _same_layout(where, inputs)
        else:
            out += device_findings(f"{where}.device", proc.device)
            out += model_findings(f"{where}.model", proc.model)
        out += _output(Path(proc.output_path).expanduser(), f"{where}.output_path")
    return out + _duplicates(loaded.job.targets(), lambda i: f"config.process[{i}]")


def _same_layout(where: str, inputs: list[tuple[int, Path]]) -> list[Finding]:
    """LoRAs merged into one are in one layout (the merged file keeps it)."""
    from aitk.adapters.lora_files import read_layout

    layouts = [(j, read_layout(path)) for j, path in inputs]
    out = []
    for j, layout in layouts[1:]:
        first_j, first = layouts[0]
        if layout.style != first.style:
            out.append(error(f"{where}.loras[{j}].path", f"is a {layout.style} LoRA, "
                             f"loras[{first_j}] a {first.style} one: merge LoRAs written "
                             "for the same model in the same layout", "convert or drop "
                             "one of them", "layout_mismatch"))
    return out


def _generate(loaded: LoadedConfig) -> list[Finding]:
    from aitk.config.prompt_flags import PromptFlagError, parse_prompt

    out: list[Finding] = []
    for i, proc in enumerate(loaded.job.config.process):
        where = f"config.process[{i}]"
        out += device_findings(f"{where}.device", proc.device)
        out += model_findings(f"{where}.model", proc.model)
        for j, lora in enumerate(proc.loras):
            out += _lora_input(lora.path, f"{where}.loras[{j}].path")
        if proc.model.lora_path:
            out += _lora_input(proc.model.lora_path, f"{where}.model.lora_path")
        folder = Path(proc.output_folder).expanduser()
        existing, writable = nearest_existing(folder)
        if not writable:
            out.append(error(f"{where}.output_folder", f"{folder} cannot be written "
                             f"({existing} is not a writable folder)", "point it somewhere "
                             "writable", "output"))
        prompts = proc.generate.prompts
        if isinstance(prompts, str):
            found = _input_file(prompts, f"{where}.generate.prompts", "prompt file")
            out += found
            if not found:
                for n, line in enumerate(prompt_lines(Path(prompts).expanduser())):
                    try:
                        parse_prompt(line)
                    except PromptFlagError as exc:
                        out.append(error(f"{where}.generate.prompts", f"{prompts} line "
                                         f"{n + 1}: {exc}", "fix the line", "prompt_flag"))
    return out


MAX_PROMPT_FILE_BYTES = 16 << 20


def prompt_lines(path: Path) -> list[str]:
    """A prompt file's prompts: one a line, blank lines skipped (read bounded)."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_PROMPT_FILE_BYTES)
    return [line.strip() for line in data.decode("utf-8", errors="replace").splitlines()
            if line.strip()]


CHECKS: dict[str, Callable[[LoadedConfig], list[Finding]]] = {
    "extract": _extract, "mod": _mod, "merge": _merge, "generate": _generate}


def file_job_findings(loaded: LoadedConfig) -> list[Finding]:
    return CHECKS[loaded.kind](loaded)


