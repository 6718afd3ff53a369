"""`manager spec`: the environment (PyTorch build, wheels) for this machine, or for the
machine described by a saved `detect --json` document."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import spec as spec_rules
from manager import detect, errors
from manager.output import Result


@dataclass(frozen=True)
class Options:
    cpu: bool = False
    from_file: Path | None = None


def load_detection(path: Path) -> dict[str, Any]:
    """A `detect --json` envelope or its bare data; UsageError (exit 2) on anything else."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise errors.UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.UsageError(f"{path} is not JSON: {exc}") from None
    if isinstance(doc, dict) and isinstance(doc.get("data"), dict) and "schema_version" in doc:
        doc = doc["data"]
    if not isinstance(doc, dict):
        raise errors.UsageError(f"{path} is not a `detect --json` document")
    missing = [k for k in ("os", "arch", "python") if not isinstance(doc.get(k), str)]
    if missing:
        raise errors.UsageError(
            f"{path} is not a `detect --json` document (missing {', '.join(missing)})")
    for section in ("nvidia", "rocm", "apple", "dgx"):
        value = doc.get(section) or {}
        gpus = (value.get("gpus") or []) if isinstance(value, dict) else None
        if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
            raise errors.UsageError(f"{path} is not a `detect --json` document "
                                    f"(bad {section!r} section)")
    return doc


def run(options: Options) -> Result:
    if options.from_file is not None:
        detection = load_detection(options.from_file)
    else:
        detection = detect.probe().to_dict()
    try:
        result = spec_rules.make_spec(detection, cpu=options.cpu)
    except spec_rules.SpecRefused as refused:
        raise errors.UnsupportedMachine(refused.message, hint=refused.hint) from None
    data = result.to_dict()
    data["install_fingerprint"] = result.install_fingerprint()
    data["requirements"] = [result.torch.requirement,
                            *(c.requirement for c in result.companions)]
    return Result(data=data, messages=tuple(f"warning: {w}" for w in result.warnings))


def render(console: Console, data: Mapping[str, Any]) -> None:
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    backend = str(data.get("backend")) + (" (experimental)" if data.get("experimental") else "")
    head.add_row("Backend", backend)
    head.add_row("PyTorch build", str(data.get("flavour")))
    head.add_row("Index", str(data.get("torch_index_url") or "PyPI"))
    head.add_row("Requirements", str(data.get("requirements_file")))
    head.add_row("Python", str(data.get("python")))
    console.print(head)

    table = Table(title="Packages")
    for col in ("Package", "Version", "Kind", "Status"):
        table.add_column(col)
    torch = data.get("torch") or {}
    for wheel in (torch, *(data.get("companions") or ())):
        version = wheel["version"] + (f"+{wheel['local']}" if wheel.get("local") else "")
        kind = "required" if wheel.get("required") else "companion"
        table.add_row(wheel["name"], version, kind, "install")
    for item in (*(data.get("extras") or ()), *(data.get("accelerators") or ())):
        status = "install (optional)" if item.get("available") else f"skip: {item.get('reason')}"
        table.add_row(item["name"], item["requirement"], item.get("kind", ""), status)
    console.print(table)
    for note in data.get("notes") or ():
        console.print(f"note: {note}", markup=False)
