"""Dataset folders for the page: which exist, an audit of one (images, their sizes,
missing captions, unreadable files, and the trainer's own dataset audit per file) before
a job trains on it, where an upload goes, and the dataset manager's changes: make a
folder, write a caption (atomically), rename a file with its caption, delete into a
restorable trash (`DATASETS/.trash/<dataset>/<entry>/`, outside every dataset, so no job
trains on it), thumbnails (cached, keyed by the file's identity) and a zip of a dataset.
Only the image header is read for the audit (Pillow opens lazily), so a large folder
audits quickly and a decompression bomb is never decoded.

Edit models train on a target image with its control (reference) image(s): the job's
`control_path` names a folder whose images pair with the dataset's by file stem
(aitk.data.controls). On the page, a dataset's control folder is another dataset (as
upstream's UI has it); `<name>_control` (or `_controls`) is taken by default, and the
pairing (`pairs`) lists each target with its controls and flags what the trainer would
skip: targets without a control, controls without a target, a second file of one stem.

Everything stays inside the datasets root: a link (folder, image or caption) is followed
only while its target is inside the root too; one that leads out is reported, never
read, listed or written through.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from pathlib import Path
from typing import IO, Any

from PIL import Image, ImageOps

from aitk.data.folders import stem_index
from aitk.data.formats import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from aitk_common.files import atomic_write_bytes, atomic_write_text
from aitk_server.confine import inside, simple_name

CAPTION_EXTENSIONS = (".txt",)
UPLOAD_EXTENSIONS = (*IMAGE_EXTENSIONS, *VIDEO_EXTENSIONS, *CAPTION_EXTENSIONS)
MAX_CAPTION_BYTES = 64 * 1024
THUMB_SIDE = 256
TRASH = ".trash"  # under the datasets root; a leading dot: never a dataset's name
MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".webp": "image/webp", ".mp4": "video/mp4", ".webm": "video/webm",
               ".mov": "video/quicktime", ".mkv": "video/x-matroska"}
MAX_ENTRIES = 10_000
LINK_OUT = "a link out of the datasets folder: not read"


class DatasetError(ValueError):
    """A dataset or file name the page may not use; the message says why."""

    def __init__(self, message: str, missing: bool = False, taken: bool = False) -> None:
        super().__init__(message)
        self.missing, self.taken = missing, taken


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


CONTROL_SUFFIXES = ("_control", "_controls")  # the default control dataset of NAME
MAX_CONTROL_FOLDERS = 4  # control_path (a list) or control_path_1..3


def control_folder(root: Path, name: str, of: str) -> Path:
    """The dataset `name` as the control folder of dataset `of`: a dataset folder under
    the root, never one reached by a link out of it, never `of` itself."""
    if not simple_name(name):
        raise DatasetError("a control folder is a dataset's name under the datasets folder")
    if name == of:
        raise DatasetError("a dataset cannot be its own control folder")
    candidate = root / name
    if (candidate.is_symlink() or candidate.exists()) and not stays_inside(candidate, root):
        raise DatasetError(f"{name} points outside the datasets folder; not read")
    return folder(root, name)


def default_controls(root: Path, name: str) -> list[str]:
    """The control dataset of `name` by convention, when there is one."""
    for suffix in CONTROL_SUFFIXES:
        other = f"{name}{suffix}"
        if simple_name(other) and (root / other).is_dir() and stays_inside(root / other,
                                                                             root):
            return [other]
    return []


def pair_by_stem(targets: list[str], controls: dict[str, list[str]]) -> dict[str, Any]:
    """The trainer's pairing (aitk.data.controls) over file names: each target image
    with its control in each folder (None where it has none), in the folders' order.
    Flags what the trainer skips: targets lacking a control in some folder, and per
    folder the controls no target has and the files a same-stem file shadows."""
    indexes = {f: stem_index(Path(n) for n in names) for f, names in controls.items()}
    pairs, missing = [], []
    for target in sorted(targets):
        found = [index.get(Path(target).stem) for index in indexes.values()]
        pairs.append({"target": target, "controls": [p.name if p else None for p in found]})
        if None in found:
            missing.append(target)
    stems = {Path(t).stem for t in targets}
    return {"pairs": pairs, "missing_control": missing,
            "unpaired": {f: sorted(n for n in names if Path(n).stem not in stems)
                         for f, names in controls.items()},
            "shadowed": {f: sorted(set(names) - {p.name for p in indexes[f].values()})
                         for f, names in controls.items()}}


def _images(base: Path, root: Path) -> tuple[list[str], list[str]]:
    """A folder's image names (never a link out, which is listed apart)."""
    images, out = [], []
    for path in sorted(base.iterdir())[:MAX_ENTRIES]:
        if path.suffix.lower() not in IMAGE_EXTENSIONS:
            continue
        if not stays_inside(path, root):
            out.append(path.name)
        elif path.is_file():
            images.append(path.name)
    return images, out


def control_pairs(root: Path, name: str, controls: list[str] | None) -> dict[str, Any]:
    """Dataset `name`'s targets paired with the control datasets `controls` (None: the
    default by convention). Every folder is checked before any is listed."""
    base = folder(root, name)
    chosen = default_controls(root, name) if controls is None else controls
    if len(chosen) > MAX_CONTROL_FOLDERS or len(set(chosen)) != len(chosen):
        raise DatasetError(f"name 1 to {MAX_CONTROL_FOLDERS} control folders, each once")
    where = {c: control_folder(root, c, name) for c in chosen}
    targets, links_out = _images(base, root)
    listed = {}
    for c, path in where.items():
        listed[c], out = _images(path, root)
        links_out += [f"{c}/{n}" for n in out]
    return {"dataset": name, "controls": chosen, **pair_by_stem(targets, listed),
            "links_out": links_out,
            "candidates": [d["name"] for d in folders(root) if d["name"] != name]}


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
    images, videos, missing, unreadable, other = [], [], [], [], []
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
        elif path.suffix.lower() in VIDEO_EXTENSIONS:  # trained when num_frames > 1
            caption = path.with_suffix(f".{caption_ext}")
            has_caption = caption.is_file() and stays_inside(caption, root)
            videos.append({"file": path.name,
                           "caption": _caption(caption) if has_caption else None})
        elif path.suffix != f".{caption_ext}":
            other.append(path.name)
    return {"images": images, "videos": videos, "missing_captions": missing,
            "unreadable": unreadable,
            "ignored": other, "truncated": len(entries) >= MAX_ENTRIES}


def _caption(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.read(2000).decode("utf-8", errors="replace")[:500]


# ---- the dataset manager ------------------------------------------------------------------
def create(root: Path, name: str) -> Path:
    """A new, empty dataset folder; DatasetError when the name is not a single name or
    the dataset exists."""
    if not simple_name(name):
        raise DatasetError("a dataset's name is a single folder name (letters, digits, "
                           "'.', '_', '-', spaces; not starting with a dot)")
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    if target.exists() or target.is_symlink():
        raise DatasetError(f"a dataset named {name!r} exists already", taken=True)
    target.mkdir()
    return target


def member(root: Path, name: str, file_name: str) -> Path:
    """The existing file `file_name` of dataset `name`, never through a link out."""
    base = folder(root, name)
    if not simple_name(file_name):
        raise DatasetError("a file name is a single name (no folders)")
    found = inside(base, file_name)
    if found is None or not found.is_file() or not stays_inside(found, root):
        raise DatasetError(f"no file {file_name!r} in {name}", missing=True)
    return found


def media_type(path: Path) -> str | None:
    """How an image or video of a dataset is shown; None: not shown inline."""
    return MEDIA_TYPES.get(path.suffix.lower())


def caption_of(image: Path, caption_ext: str = "txt") -> Path:
    return image.with_suffix(f".{caption_ext}")


def write_caption(root: Path, name: str, image_name: str, text: str,
                  caption_ext: str = "txt") -> Path:
    """The caption of one image or clip, written atomically (the trainer never reads
    half of one); a caption that is a link is never written through."""
    image = member(root, name, image_name)
    if image.suffix.lower() not in (*IMAGE_EXTENSIONS, *VIDEO_EXTENSIONS):
        raise DatasetError("captions belong to images and videos")
    if len(text.encode("utf-8")) > MAX_CAPTION_BYTES:
        raise DatasetError(f"a caption is at most {MAX_CAPTION_BYTES // 1024} KiB")
    caption = caption_of(image, caption_ext)
    if caption.is_symlink():
        raise DatasetError("that caption is a link; it is not written through")
    atomic_write_text(caption, text)
    return caption


def _with_caption(image: Path, caption_ext: str) -> list[Path]:
    """The file and, for an image or clip, its caption when there is one (not a link)."""
    files = [image]
    caption = caption_of(image, caption_ext)
    if image.suffix.lower() not in CAPTION_EXTENSIONS and caption.is_file() \
            and not caption.is_symlink():
        files.append(caption)
    return files


def rename(root: Path, name: str, file_name: str, new_stem: str,
           caption_ext: str = "txt") -> str:
    """`file_name` (and its caption) renamed to `new_stem` + its own suffix; the new
    file name. Nothing is replaced: a taken name is a DatasetError."""
    image = member(root, name, file_name)
    new_name = new_stem + image.suffix
    if not simple_name(new_name) or "." in new_stem and Path(new_stem).suffix.lower() in \
            UPLOAD_EXTENSIONS:
        raise DatasetError("the new name is a single name, without its extension")
    moves = [(path, path.with_name(new_stem + path.suffix))
             for path in _with_caption(image, caption_ext)]
    taken = [new.name for _, new in moves if new.exists() or new.is_symlink()]
    if taken:
        raise DatasetError(f"{', '.join(taken)} exists already", taken=True)
    for old, new in moves:
        os.rename(old, new)
    return new_name


def trash(root: Path, name: str, file_name: str, caption_ext: str = "txt") -> str:
    """Move a file and its caption into the dataset's trash; the entry's id (restore
    puts them back)."""
    image = member(root, name, file_name)
    entry = f"{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 10**6:06d}"
    target = root / TRASH / name / entry
    target.mkdir(parents=True)
    for path in _with_caption(image, caption_ext):
        os.rename(path, target / path.name)
    return entry


def trashed(root: Path, name: str) -> list[dict[str, Any]]:
    """The dataset's trash, newest first: [{entry, files}]."""
    base = root / TRASH / name
    if not simple_name(name) or not base.is_dir() or not stays_inside(base, root):
        return []
    return [{"entry": e.name, "files": sorted(p.name for p in e.iterdir())}
            for e in sorted(base.iterdir(), reverse=True)
            if e.is_dir() and not e.is_symlink()]


def restore(root: Path, name: str, entry: str) -> list[str]:
    """Put a trash entry's files back; DatasetError (taken) when a name is in use."""
    base = folder(root, name)
    if not simple_name(entry):
        raise DatasetError("no such trash entry", missing=True)
    source = root / TRASH / name / entry
    if source.is_symlink() or not source.is_dir() or not stays_inside(source, root):
        raise DatasetError("no such trash entry", missing=True)
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.is_symlink())
    taken = [p.name for p in files if (base / p.name).exists()]
    if taken:
        raise DatasetError(f"{', '.join(taken)} exists again in {name}; rename it first",
                           taken=True)
    for path in files:
        os.rename(path, base / path.name)
    source.rmdir()
    return [p.name for p in files]


def thumbnail(root: Path, name: str, file_name: str, cache: Path) -> Path:
    """A JPEG of at most THUMB_SIDE pixels a side (EXIF rotation applied), cached under
    `cache` by the file's path, size and mtime (a changed file gets a new one)."""
    image = member(root, name, file_name)
    if image.suffix.lower() not in IMAGE_EXTENSIONS:
        raise DatasetError("thumbnails are made of images")
    stat = image.stat()
    key = hashlib.sha256(f"{image.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
                         .encode()).hexdigest()[:32]
    thumb = cache / f"{key}.jpg"
    if thumb.is_file():
        return thumb
    try:
        with Image.open(image) as img:
            img.draft("RGB", (THUMB_SIDE, THUMB_SIDE))  # JPEG: decode at a fraction
            small = ImageOps.exif_transpose(img)
            small.thumbnail((THUMB_SIDE, THUMB_SIDE))
            out = io.BytesIO()
            small.convert("RGB").save(out, format="JPEG", quality=85)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{file_name} cannot be read as an image ({str(exc)[:120]})"
                           ) from None
    cache.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(thumb, out.getvalue())
    return thumb


def write_zip(root: Path, name: str, out: IO[bytes]) -> int:
    """The dataset's files (no subfolders, no link out) into a zip; how many."""
    base = folder(root, name)
    count = 0
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(base.iterdir())[:MAX_ENTRIES]:
            if path.is_symlink() or not path.is_file() or not stays_inside(path, root):
                continue
            archive.write(path, f"{name}/{path.name}")
            count += 1
    return count


def findings(folder_path: Path, caption_ext: str = "txt") -> dict[str, list[dict[str, str]]]:
    """The trainer's dataset audit (aitk.audit.dataset) as findings per file:
    {file name: [{level, message, fix, code}]}; "" holds the folder's own."""
    from aitk.audit.dataset import DatasetOptions, audit_dataset

    report = audit_dataset(DatasetOptions(folder_path, caption_ext=caption_ext))
    out: dict[str, list[dict[str, str]]] = {}
    for found in report.findings:
        where = found.path if found.path and found.path != str(folder_path) else ""
        out.setdefault(Path(where).name if where else "", []).append(
            {"level": found.level.value, "message": found.message, "fix": found.fix,
             "code": found.code})
    return out
