"""Dataset folders for the page: which exist, an audit of one (images, their sizes,
missing captions, unreadable files) before a job trains on it, and where an upload goes.
Only the image header is read (Pillow opens lazily), so a large folder audits quickly
and a decompression bomb is never decoded.

Everything stays inside the datasets root: a link (folder, image or caption) is followed
only while its target is inside the root too; one that leads out is reported, never
read, listed or written through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from aitk_server.confine import inside, simple_name

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
UPLOAD_EXTENSIONS = (*IMAGE_EXTENSIONS, ".txt")
MAX_ENTRIES = 10_000
LINK_OUT = "a link out of the datasets folder: not read"


class DatasetError(ValueError):
    """A dataset or file name the page may not use; the message says why."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def stays_inside(path: Path, root: Path) -> bool:
    """`path`, with every link followed, is inside `root` (and exists)."""
    try:
        return path.resolve(strict=True).is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):
        return False


def folders(root: Path) -> list[dict[str, Any]]:
    if not root.is_dir():
        return []
    out = []
    for sub in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        if not sub.is_dir() or not stays_inside(sub, root):
            continue
        images = sum(1 for p in sub.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS
                     and stays_inside(p, root))
        out.append({"name": sub.name, "images": images})
    return out


def folder(root: Path, name: str) -> Path:
    """The existing dataset folder `name` (a single name under the root)."""
    if not simple_name(name):
        raise DatasetError("a dataset is a folder name under the datasets folder")
    found = inside(root, name)
    if found is None or not found.is_dir():
        raise DatasetError(f"no dataset folder {name!r}", missing=True)
    return found


def upload_target(root: Path, name: str, file_name: str) -> Path:
    """Where an upload of `file_name` into dataset `name` is written (the folder is made
    when new); DatasetError for a name, type or link the page may not use."""
    if not simple_name(name) or not simple_name(file_name):
        raise DatasetError("dataset and file names are single names (no folders)")
    if Path(file_name).suffix.lower() not in UPLOAD_EXTENSIONS:
        raise DatasetError("only " + ", ".join(UPLOAD_EXTENSIONS) + " files can be uploaded")
    root.mkdir(parents=True, exist_ok=True)
    target_dir = root / name
    if target_dir.is_symlink() or (target_dir.exists() and not stays_inside(target_dir,
                                                                            root)):
        raise DatasetError("that dataset folder points outside the datasets folder")
    target_dir.mkdir(exist_ok=True)
    target = target_dir / file_name
    if target.is_symlink():
        raise DatasetError("that file is a symlink; it is not replaced")
    return target


def audit(folder: Path, root: Path, caption_ext: str = "txt") -> dict[str, Any]:
    images, missing, unreadable, other = [], [], [], []
    entries = sorted(folder.iterdir())[:MAX_ENTRIES]
    for path in entries:
        if not stays_inside(path, root):
            if path.suffix.lower() in IMAGE_EXTENSIONS:
                unreadable.append({"file": path.name, "reason": LINK_OUT})
            elif path.is_symlink():
                other.append(path.name)
            continue
        if not path.is_file():
            continue
        if path.suffix.lower() in IMAGE_EXTENSIONS:
            try:
                with Image.open(path) as img:
                    size = img.size
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                unreadable.append({"file": path.name, "reason": str(exc)[:200]})
                continue
            caption = path.with_suffix(f".{caption_ext}")
            has_caption = caption.is_file() and stays_inside(caption, root)
            if not has_caption:
                missing.append(path.name)
            images.append({"file": path.name, "width": size[0], "height": size[1],
                           "caption": _caption(caption) if has_caption else None})
        elif path.suffix != f".{caption_ext}":
            other.append(path.name)
    return {"images": images, "missing_captions": missing, "unreadable": unreadable,
            "ignored": other, "truncated": len(entries) >= MAX_ENTRIES}


def _caption(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.read(2000).decode("utf-8", errors="replace")[:500]
