"""Load one part of a model from a diffusers folder or a Hugging Face hub id.

`name_or_path` is a local folder (parts in subfolders) or a hub id, fetched by the
libraries' own `from_pretrained` (which honour HF_HOME, HF_TOKEN and HF_HUB_OFFLINE).
Every way that can fail (missing folder or file, offline with nothing cached, a gated
or unknown repo, a broken config) becomes one ModelLoadError line naming the model,
the part and what to do, which the job turns into exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aitk.models.base import ModelLoadError


def is_local(name_or_path: str) -> bool:
    return Path(name_or_path).expanduser().exists()


def load_part(cls: Any, name_or_path: str, subfolder: str, arch: str, **kwargs: Any) -> Any:
    root = Path(name_or_path).expanduser()
    try:
        if root.is_dir():
            if not (root / subfolder).is_dir():
                raise ModelLoadError(f"{arch} model folder {root} has no {subfolder}/ "
                                     "(expected a diffusers layout)")
            return cls.from_pretrained(root / subfolder, **kwargs)
        if root.exists():
            raise ModelLoadError(f"{arch} model {root} is a file; point model.name_or_path "
                                 "at a diffusers folder or a hub id")
        return cls.from_pretrained(name_or_path, subfolder=subfolder, **kwargs)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:300]
        where = f"folder {root}" if root.is_dir() else f"hub id {name_or_path!r}"
        fix = ("check the folder" if root.is_dir() else
               "download it first (huggingface-cli download, with HF_TOKEN for gated "
               "models) or point model.name_or_path at a local diffusers folder")
        raise ModelLoadError(f"cannot load the {arch} {subfolder} from {where}: {detail}; "
                             f"{fix}") from None
