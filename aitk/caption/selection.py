"""Which files of a dataset folder get a caption.

`scan` turns the folder into facts (each picture file and the state of its caption
file); `select` is the decision, a pure function of those facts and the settings:

- a file whose caption is missing, or empty (0 bytes: nothing to lose), is captioned;
- one with a caption is kept, unless `overwrite` (then it is captioned again and the
  caption replaced atomically; a caption that is a link is replaced by a file, the
  link's target is never written);
- a caption path that is not a file at all (a folder, a FIFO) is never touched;
- `limit` caps how many are captioned, in name order (the rest are left for later).

Light: no torch, nothing read but folder entries and file metadata.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from aitk.data.folders import folder_entries, is_regular_file
from aitk.data.formats import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from aitk.errors import DatasetError

MEDIA_EXTENSIONS = IMAGE_EXTENSIONS + VIDEO_EXTENSIONS


class CaptionState(Enum):
    MISSING = "missing"
    EMPTY = "empty"  # a 0-byte file
    PRESENT = "present"  # a file with text, or a link
    BLOCKED = "blocked"  # something that is not a file (a folder, a FIFO, a device)


@dataclass(frozen=True)
class MediaFile:
    path: Path  # the image or video
    caption: Path  # its caption file, beside it
    state: CaptionState


@dataclass(frozen=True)
class Selection:
    todo: tuple[MediaFile, ...]  # to caption, in name order
    kept: tuple[MediaFile, ...]  # captioned already, left as they are
    blocked: tuple[MediaFile, ...]  # caption path is not a file: never written
    deferred: int  # needed a caption but fell beyond `limit`


def caption_state(caption: Path) -> CaptionState:
    try:
        info = os.lstat(caption)
    except FileNotFoundError:
        return CaptionState.MISSING
    except OSError:
        return CaptionState.BLOCKED
    if stat.S_ISLNK(info.st_mode):
        return CaptionState.PRESENT
    if not stat.S_ISREG(info.st_mode):
        return CaptionState.BLOCKED
    return CaptionState.EMPTY if info.st_size == 0 else CaptionState.PRESENT


def scan(folder: Path, caption_suffix: str = ".txt") -> list[MediaFile]:
    """Every image and video of `folder` (not its subfolders) with its caption's state.
    DatasetError when the folder does not exist, cannot be listed or holds no picture."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DatasetError(f"dataset folder {folder} {what}")
    found = [MediaFile(p, p.with_suffix(caption_suffix), caption_state(p.with_suffix(
        caption_suffix))) for p in folder_entries(folder)
        if p.suffix.lower() in MEDIA_EXTENSIONS and is_regular_file(p)]
    if not found:
        raise DatasetError(f"dataset folder {folder} has no images or videos "
                           f"({', '.join(MEDIA_EXTENSIONS)})")
    return found


def select(files: Sequence[MediaFile], overwrite: bool, limit: int | None = None
           ) -> Selection:
    wanted = {CaptionState.MISSING, CaptionState.EMPTY}
    if overwrite:
        wanted.add(CaptionState.PRESENT)
    todo = [f for f in files if f.state in wanted]
    cap = len(todo) if limit is None else max(0, limit)
    return Selection(
        todo=tuple(todo[:cap]),
        kept=tuple(f for f in files if f.state is CaptionState.PRESENT and not overwrite),
        blocked=tuple(f for f in files if f.state is CaptionState.BLOCKED),
        deferred=max(0, len(todo) - cap))
