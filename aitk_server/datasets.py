"""Dataset folders for the page: which exist, and an audit of one (images, their sizes,
missing captions, unreadable files) before a job trains on it. Only the image header is
read (Pillow opens lazily), so a large folder audits quickly and a decompression bomb is
never decoded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
UPLOAD_EXTENSIONS = (*IMAGE_EXTENSIONS, ".txt")
MAX_ENTRIES = 10_000


def folders(root: Path) -> list[dict[str, Any]]:
    if not root.is_dir():
        return []
    out = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        images = sum(1 for p in sub.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        out.append({"name": sub.name, "images": images})
    return out


def audit(folder: Path, caption_ext: str = "txt") -> dict[str, Any]:
    images, missing, unreadable, other = [], [], [], []
    entries = sorted(folder.iterdir())[:MAX_ENTRIES]
    for path in entries:
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
            has_caption = caption.is_file()
            if not has_caption:
                missing.append(path.name)
            images.append({"file": path.name, "width": size[0], "height": size[1],
                           "caption": caption.read_text(encoding="utf-8", errors="replace")
                           [:500] if has_caption else None})
        elif path.suffix != f".{caption_ext}":
            other.append(path.name)
    return {"images": images, "missing_captions": missing, "unreadable": unreadable,
            "ignored": other, "truncated": len(entries) >= MAX_ENTRIES}
