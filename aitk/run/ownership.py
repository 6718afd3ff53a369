"""How aitk recognises the files it wrote, so that it removes or overwrites only those
(a user's file at one of its names is left alone). Light on purpose: the web UI uses it
too, and it must not import torch.

- LoRA files (and a full fine-tune's single-file model): safetensors metadata
  `software` names aitk (aitk.run.provenance writes it);
- model folders (a full fine-tune or a merge saved as diffusers): MODEL_MARKER inside,
  naming aitk and listing every file written (only those are ever removed);
- previews: EXIF `Software` = aitk (PNG, JPEG, WebP, animated WebP); an mp4 preview's
  container `comment` tag = aitk (read with PyAV);
- config.yaml: its first line is CONFIG_HEADER;
- loss_log.jsonl: aitk.run.metrics.is_loss_log; checkpoints: aitk.run.checkpoint.is_ours.
Links are never ours: replacing one would replace the user's link.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aitk

CONFIG_HEADER = "# the config as run, written by aitk at every start of this job\n"
MODEL_MARKER = "aitk_model.json"
EXIF_SOFTWARE = 0x0131  # the EXIF tag PNG, JPEG and WebP all carry


def _regular(path: Path) -> bool:
    return not path.is_symlink() and path.is_file()


def lora_is_ours(path: Path) -> bool:
    """A safetensors file whose metadata names aitk as its software."""
    from safetensors import safe_open

    if not _regular(path):
        return False
    try:
        with safe_open(str(path), "numpy") as fh:  # numpy: no torch needed to read a header
            meta = fh.metadata() or {}
        return json.loads(meta.get("software", "{}")).get("name") == aitk.SOFTWARE_NAME
    except Exception:  # not safetensors, unreadable: not ours either way
        return False


def lora_header_is_ours(path: Path, max_header: int = 100 * 2**20) -> bool:
    """A safetensors file, possibly torn after its header (a write that was killed),
    whose header's metadata names aitk as its software. Standard library only."""
    if not _regular(path):
        return False
    try:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if not 0 < size <= max_header:
                return False
            header = json.loads(fh.read(size))
        software = json.loads(header["__metadata__"]["software"])
        return software.get("name") == aitk.SOFTWARE_NAME
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def image_mark() -> Any:
    """The EXIF block every preview is saved with."""
    from PIL import Image

    mark = Image.Exif()
    mark[EXIF_SOFTWARE] = aitk.SOFTWARE_NAME
    return mark


def image_is_ours(path: Path) -> bool:
    """A regular file whose EXIF `Software` names aitk."""
    from PIL import Image

    if not _regular(path):
        return False
    try:
        with Image.open(path) as image:
            return image.getexif().get(EXIF_SOFTWARE) == aitk.SOFTWARE_NAME
    except Exception:  # not an image, unreadable: not ours either way
        return False


MP4_TAG = "comment"  # the container tag an mp4 preview names aitk in


def video_is_ours(path: Path) -> bool:
    """A regular mp4 file whose container `comment` tag names aitk."""
    if not _regular(path):
        return False
    try:
        import av

        with av.open(str(path)) as container:
            return container.metadata.get(MP4_TAG) == aitk.SOFTWARE_NAME
    except Exception:  # not a video, unreadable: not ours either way
        return False


def preview_is_ours(path: Path) -> bool:
    """An image preview (EXIF mark) or an mp4 one (container tag)."""
    return video_is_ours(path) if path.suffix.lower() == ".mp4" else image_is_ours(path)


def config_is_ours(path: Path) -> bool:
    """A config.yaml whose first line is aitk's header."""
    if not _regular(path):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(len(CONFIG_HEADER.encode())).decode("utf-8") == CONFIG_HEADER
    except (OSError, ValueError):
        return False


def model_folder_files(path: Path) -> list[Path] | None:
    """The files aitk wrote in a model folder (from its MODEL_MARKER, which is among
    them); None when the folder is not one aitk wrote."""
    if path.is_symlink() or not path.is_dir():
        return None
    marker = path / MODEL_MARKER
    if not _regular(marker):
        return None
    try:
        with open(marker, "rb") as fh:
            data = json.loads(fh.read(1 << 20))
        if json.loads(data["software"]).get("name") != aitk.SOFTWARE_NAME:
            return None
        files = [path / name for name in data["files"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if any(".." in Path(name).parts or Path(name).is_absolute() for name in data["files"]):
        return None
    return [*files, marker]


def model_folder_is_ours(path: Path) -> bool:
    return model_folder_files(path) is not None
