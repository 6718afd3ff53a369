"""What the file jobs (extract, mod, merge, generate) share: the metadata their outputs
carry (aitk's mark, where the run came from, what made the file) and the rule that an
output path held by someone else's file is never overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import aitk
from aitk.config.loading import LoadedConfig
from aitk.errors import OutputFolderError
from aitk.run import provenance


def software() -> str:
    return json.dumps({"name": aitk.SOFTWARE_NAME, "version": aitk.__version__})


def output_metadata(loaded: LoadedConfig, made: Mapping[str, Any],
                    base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (a source file's metadata, or the job's `meta`) plus aitk's mark, the
    config as run and `aitk_job`: what made this file (kind, inputs, settings)."""
    out = {str(k): v if isinstance(v, str) else json.dumps(v)
           for k, v in (base or {}).items()}
    out.update({"name": loaded.name, "software": software(),
                "config": json.dumps(loaded.recorded),
                "aitk_info": json.dumps(provenance.collect()),
                "aitk_job": json.dumps({"kind": loaded.kind, **made})})
    return out


def claim(target: Path, replaces: Iterable[Path] = ()) -> None:
    """Refuse (exit 2) an output path that holds a file aitk did not write, unless it is
    an input the config asks to replace. Checked again right before writing: the
    preflight ran earlier, and files move."""
    from aitk.run.ownership import lora_is_ours, model_folder_is_ours

    if not (target.exists() or target.is_symlink()):
        return
    if any(target.resolve() == Path(r).expanduser().resolve() for r in replaces):
        return
    ours = model_folder_is_ours(target) if target.is_dir() else lora_is_ours(target)
    if not ours:
        raise OutputFolderError(f"{target} was not written by aitk and would be overwritten; "
                            "move it away or choose another output path")


def job_meta(loaded: LoadedConfig) -> dict[str, Any]:
    """The config's `meta:` section with `[name]` already replaced (as upstream)."""
    return dict(loaded.job.meta)
