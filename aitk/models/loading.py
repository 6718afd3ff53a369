"""Load one part of a model from a diffusers folder or a Hugging Face hub id.

`name_or_path` is a local folder (parts in subfolders) or a hub id, fetched by the
libraries' own `from_pretrained` (which honour HF_HOME, HF_TOKEN and HF_HUB_OFFLINE).
Every way that can fail (missing folder or file, offline with nothing cached, a gated
or unknown repo, a broken config) becomes one ModelLoadError line naming the model's
arch, the source, the part and what to do, which the job turns into exit 2.
`check_source` refuses, before any weights load, a source that cannot be a model;
`load_part` loads each part (`load_part_config` just its config); `freeze` readies what
was loaded for training.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitk.errors import ModelLoadError

if TYPE_CHECKING:
    from torch import nn

# What to do about a hub id that did not load: every hint the archs gave, in one line.
HUB_FIX = ("check the name and download it first (huggingface-cli download, or a run with "
           "HF_HUB_OFFLINE unset; a gated model needs HF_TOKEN and its license accepted; "
           "downloads are kept under HF_HOME) or point model.name_or_path at a local "
           "diffusers folder")


def _subfolders(parts: Sequence[str]) -> str:
    return ", ".join(f"{p}/" for p in parts)


def _single_file(arch: str, name_or_path: str, hint: str = "") -> ModelLoadError:
    # Upstream configs may name one weights file; aitk loads diffusers layouts only.
    return ModelLoadError(f"{arch} model {name_or_path} is a single file; point "
                          f"model.name_or_path at a diffusers {arch} folder or a hub id"
                          + (f" ({hint})" if hint else ""))


def _hub_id_shaped(name: str) -> bool:
    """`owner/name`: one slash, no path prefix or backslash."""
    return not name.startswith((".", "/", "~")) and name.count("/") == 1 and "\\" not in name


def check_source(name_or_path: str, arch: str, parts: Sequence[str],
                 single_file_hint: str = "") -> None:
    """Refuse with one line a source no part can load from: a folder lacking any of
    `parts` (all of them named), a single weights file (here, or a `.safetensors` name
    in a hub repo; `single_file_hint` says where the arch's diffusers model is), or a path
    that is not there and cannot be a hub id. A hub id passes: the hub answers for it."""
    root = Path(name_or_path).expanduser()
    if root.is_dir():
        missing = [p for p in parts if not (root / p).is_dir()]
        if missing:
            raise ModelLoadError(f"{arch} model folder {root} lacks {_subfolders(missing)} "
                                 f"(a diffusers {arch} folder has {_subfolders(parts)})")
        return
    if root.is_file() or name_or_path.endswith(".safetensors"):
        raise _single_file(arch, name_or_path, single_file_hint)
    if not _hub_id_shaped(name_or_path):
        raise ModelLoadError(f"{arch} model folder {root} does not exist (model.name_or_path "
                             "is neither a diffusers model folder nor a hub id owner/name)")


def load_part(cls: Any, name_or_path: str, subfolder: str, arch: str, **kwargs: Any) -> Any:
    """`cls.from_pretrained` of `subfolder` in the folder or hub repo, `kwargs` passed on
    (dtype, variant, ...); `arch` is the model's name in the error lines."""
    root = Path(name_or_path).expanduser()
    try:
        if root.is_dir():
            if not (root / subfolder).is_dir():
                raise ModelLoadError(f"{arch} model folder {root} lacks {subfolder}/ "
                                     "(expected a diffusers layout)")
            return cls.from_pretrained(root / subfolder, **kwargs)
        if root.exists():
            raise _single_file(arch, name_or_path)
        return cls.from_pretrained(name_or_path, subfolder=subfolder, **kwargs)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        where = f"model folder {root}" if root.is_dir() else f"model from hub id {name_or_path!r}"
        fix = "check the folder" if root.is_dir() else HUB_FIX
        raise ModelLoadError(f"cannot load the {arch} {where} ({subfolder}/): {detail}; "
                             f"{fix}") from None


def load_part_config(cls: Any, name_or_path: str, subfolder: str, arch: str,
                     **kwargs: Any) -> dict[str, Any]:
    """A part's config alone (`cls.load_config`), with `load_part`'s checks and error
    lines: for a scheduler whose class the config itself names."""
    return load_part(_ConfigOnly(cls), name_or_path, subfolder, arch, **kwargs)


def load_scheduler(name_or_path: str, arch: str, default: Any, **overrides: Any) -> Any:
    """The scheduler a model ships, built from its config by the class the config names
    (`default` when it names none diffusers has). `from_pretrained` would not do: it
    rewrites the config's class name to its own."""
    import diffusers

    config = load_part_config(default, name_or_path, "scheduler", arch)
    cls = getattr(diffusers, str(config.get("_class_name", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        cls = default
    return cls.from_config(config, **overrides)


def hub_file(repo_id: str, filename: str, arch: str, what: str) -> Path:
    """One file of a hub repo (`hf_hub_download`, which honours HF_HOME, HF_TOKEN and
    HF_HUB_OFFLINE): its local path, or one ModelLoadError line naming `what` (the
    config key that asked for it) and the fix."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"cannot load the {arch} {what} {filename} from hub id "
                             f"{repo_id!r}: {detail}; {HUB_FIX}") from None


class _ConfigOnly:
    """Adapts `load_config` to load_part's `from_pretrained` call."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def from_pretrained(self, path: Any, subfolder: str | None = None, **kwargs: Any) -> Any:
        return self.cls.load_config(path, subfolder=subfolder, **kwargs)


def freeze(*modules: nn.Module) -> None:
    """Loaded parts as training wants them: no gradients, eval mode (an adapter adds its
    own trainable weights later)."""
    for module in modules:
        module.requires_grad_(False)
        module.eval()
