"""The spec this sync installs: spec.make_spec over this machine's detection.

Two overrides, both from the environment:
- AITK_TORCH_INDEX_URL replaces the spec's PyTorch index (an internal mirror); the value
  `pypi` means the default index plus find-links.
- AITK_SPEC_FILE names a JSON spec (what `manager spec --json` prints) to use instead of
  detecting: for support ("install exactly this") and for the hermetic tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import spec as spec_module
from manager import errors, indexes
from spec import Optional_, Spec, SpecRefused, Wheel

SPEC_FILE_ENV = "AITK_SPEC_FILE"


def current_spec(cpu: bool | None) -> Spec:
    """The spec for this machine; UnsupportedMachine when spec.py refuses it."""
    source = os.environ.get(SPEC_FILE_ENV)
    if source:
        spec = spec_from_file(Path(source))
    else:
        from manager import detect

        try:
            spec = spec_module.make_spec(detect.probe().to_dict(), cpu=bool(cpu))
        except SpecRefused as exc:
            raise errors.UnsupportedMachine(
                str(exc), hint="`--cpu` installs the CPU build on a machine without a "
                               "supported GPU") from exc
    overridden, url = indexes.torch_index_override()
    if overridden:
        spec = dataclasses.replace(spec, torch_index_url=url)
    return spec


def spec_from_dict(data: dict[str, Any]) -> Spec:
    if "data" in data and "torch" not in data:  # a whole `--json` envelope
        data = data["data"]
    fields = {f.name for f in dataclasses.fields(Spec)}
    values = {k: v for k, v in data.items() if k in fields}
    values["torch"] = Wheel(**values["torch"])
    values["companions"] = tuple(Wheel(**c) for c in values.get("companions", ()))
    for key in ("extras", "accelerators"):
        values[key] = tuple(Optional_(**{**o, "needs": tuple(o.get("needs", ()))})
                            for o in values.get(key, ()))
    for key in ("notes", "warnings"):
        values[key] = tuple(values.get(key, ()))
    return Spec(**values)


def spec_from_file(path: Path) -> Spec:
    try:
        return spec_from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise errors.UsageError(f"{SPEC_FILE_ENV}={path}: not a usable spec ({exc})",
                                hint="use what `python3 -m manager spec --json` prints") from exc
