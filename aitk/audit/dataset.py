"""`python -m aitk audit dataset DIR`: what a training folder really holds.

Counts by kind; unreadable and truncated images; missing, empty and orphan captions;
caption lengths and trigger presence; control pairing; sizes, aspect ratios, images
smaller than the resolution (upstream upscales them, aitk trains them at their own
size), the bucket each image lands in for the arch; exact duplicates by content hash;
EXIF rotation; colour modes (CMYK, 16-bit, alpha).

Videos count as training files when `videos` is set (a dataset with num_frames above 1);
they are counted here, not decoded: the trainer's scan reports any it cannot use.

`quick=True` reads image headers only (no decode, no hashing): the preflight uses it to
answer "is this folder usable?" in a moment. No torch here.
"""

from __future__ import annotations

import hashlib
import statistics
import warnings
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from aitk.data.buckets import bucket_for
from aitk.data.folders import folder_entries, is_regular_file
from aitk.data.formats import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from aitk.errors import DatasetError
from aitk.findings import Finding, Report, error, info, warning

CAPTION_READ_LIMIT = 1 << 20  # a caption is text; never read an endless file whole
LONG_CAPTION_WORDS = 200  # beyond a T5/CLIP context either way
EXTREME_ASPECT = 4.0
SIXTEEN_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N", "I", "F"}
ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


@dataclass(frozen=True)
class DatasetOptions:
    folder: Path
    controls: Sequence[Path] = ()
    resolutions: Sequence[int] = (512,)
    arch: str | None = None
    caption_ext: str = "txt"
    trigger: str | None = None
    default_caption: str | None = None
    quick: bool = False
    videos: bool = False  # num_frames > 1: video files are training files too
    scale: float = 1.0  # the dataset's `scale` and `square_crop` (aitk.data.buckets)
    square_crop: bool = False


@dataclass
class _Image:
    rel: str
    size: tuple[int, int] | None = None  # after EXIF rotation
    caption: str | None = None


@dataclass
class _Scan:
    images: list[_Image] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    hashes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    videos: int = 0


def _caption_suffix(ext: str) -> str:
    return ext if ext.startswith(".") else f".{ext}"


def read_caption_bounded(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.read(CAPTION_READ_LIMIT).decode("utf-8").strip()


def _probe_image(path: Path, rel: str, quick: bool, scan: _Scan) -> tuple[int, int] | None:
    """The image's size after EXIF rotation, with findings about it; None if unusable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                mode, (w, h) = img.mode, img.size
                orientation = img.getexif().get(0x0112, 1)
                transparent = "transparency" in img.info
                if not quick:
                    img.load()  # a truncated file has a valid header; decoding finds it
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        scan.findings.append(error(rel, f"too large to decode safely ({exc})",
                                   "downscale the image", "too_large"))
        return None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        truncated = "truncated" in str(exc)
        scan.findings.append(error(
            rel, "truncated image (the file ends early)" if truncated else
            f"unreadable image ({exc.__class__.__name__})", "re-export or remove the file",
            "truncated" if truncated else "unreadable"))
        return None
    if orientation in (5, 6, 7, 8):
        w, h = h, w
    if orientation != 1:
        scan.findings.append(info(rel, f"EXIF orientation {orientation}: trained as shown "
                                       f"({w}x{h}), not as stored", code="exif_rotated"))
    if mode == "CMYK":
        scan.findings.append(warning(rel, "CMYK image: converted to RGB, colours may shift",
                                     "save it as RGB", "cmyk"))
    elif mode in SIXTEEN_BIT_MODES:
        scan.findings.append(warning(rel, f"16-bit/float image (mode {mode}): reduced to "
                                          "8-bit RGB", "save it as 8-bit RGB", "high_bit"))
    if mode in ALPHA_MODES or (mode == "P" and transparent):
        scan.findings.append(warning(rel, "has an alpha channel: transparency is dropped "
                                          "when converted to RGB", "flatten it onto the "
                                          "background you want", "alpha"))
    return w, h


def _scan(opts: DatasetOptions) -> _Scan:
    scan = _Scan()
    suffix = _caption_suffix(opts.caption_ext)
    files = []
    for entry in folder_entries(opts.folder):  # DatasetError: the caller's finding
        try:
            if entry.is_file():
                files.append(entry)
        except OSError as exc:  # permissions, a mount gone: say it, look at the rest
            scan.findings.append(warning(entry.name, f"cannot be looked at "
                                         f"({exc.strerror or exc}); skipped",
                                         "check its permissions", "unreadable"))
    kinds = IMAGE_EXTENSIONS + (VIDEO_EXTENSIONS if opts.videos else ())
    image_stems = {p.stem for p in files if p.suffix.lower() in kinds}
    for path in files:
        ext = path.suffix.lower()
        rel = path.name
        if opts.videos and ext in VIDEO_EXTENSIONS:
            scan.kinds[f"video {ext.lstrip('.')}"] += 1
            scan.videos += 1
            continue
        if ext in IMAGE_EXTENSIONS:
            scan.kinds[f"image {ext.lstrip('.')}"] += 1
        elif ext == suffix.lower():
            scan.kinds["caption"] += 1
            if path.stem not in image_stems:
                scan.findings.append(warning(rel, "caption without an image", "remove it "
                                             "or add its image", "orphan_caption"))
            continue
        else:
            scan.kinds["other"] += 1
            continue
        entry = _Image(rel)
        entry.size = _probe_image(path, rel, opts.quick, scan)
        if entry.size is None:
            continue
        if not opts.quick:
            scan.hashes[hashlib.sha256(path.read_bytes()).hexdigest()].append(rel)
        caption_file = path.with_suffix(suffix)
        if not is_regular_file(caption_file):
            scan.findings.append(
                info(rel, f"no caption file; the default caption {opts.default_caption!r} "
                          "is used", code="default_caption") if opts.default_caption else
                warning(rel, f"no caption file {caption_file.name}: trains with an empty "
                             "caption", f"write {caption_file.name} or set default_caption",
                        "missing_caption"))
        else:
            try:
                entry.caption = read_caption_bounded(caption_file)
            except (OSError, UnicodeDecodeError) as exc:
                scan.findings.append(error(caption_file.name, f"unreadable caption ({exc})",
                                           "save it as UTF-8 text", "unreadable_caption"))
            else:
                if not entry.caption:
                    scan.findings.append(warning(caption_file.name, "empty caption",
                                                 "describe the image", "empty_caption"))
        scan.images.append(entry)
    return scan


def _caption_findings(opts: DatasetOptions, scan: _Scan) -> dict[str, object]:
    captions = [i.caption for i in scan.images if i.caption]
    words = [len(c.split()) for c in captions]
    summary: dict[str, object] = {}
    if words:
        summary["caption_words"] = {"min": min(words), "mean": round(statistics.mean(words), 1),
                                    "max": max(words)}
    for image in scan.images:
        if image.caption and len(image.caption.split()) > LONG_CAPTION_WORDS:
            scan.findings.append(info(image.rel, f"long caption ({len(image.caption.split())} "
                                                 "words): the text encoder may cut it",
                                      code="long_caption"))
    if opts.trigger:
        without = [i for i in scan.images if i.caption is not None
                   and opts.trigger not in i.caption and "[trigger]" not in i.caption]
        summary["captions_with_trigger"] = len(captions) - len(without)
        for image in without:
            scan.findings.append(info(image.rel, f"caption lacks the trigger "
                                                 f"{opts.trigger!r}: it is prepended",
                                      code="trigger_prepended"))
    return summary


# Without an arch (or for one from an extension, whose facts are not known here) the
# buckets are shown on a 16 px grid, the most common multiple.
DEFAULT_DIVISIBILITY = 16


def divisibility(arch: str | None) -> int:
    """Image sides of `arch` are multiples of this (its description's size multiple)."""
    from aitk.models import catalog

    if arch is None or arch not in catalog.builtin_archs():
        return DEFAULT_DIVISIBILITY
    return catalog.size_multiple(arch)


def _size_findings(opts: DatasetOptions, scan: _Scan) -> dict[str, object]:
    div = divisibility(opts.arch)
    sized = [i for i in scan.images if i.size]
    summary: dict[str, object] = {"divisibility": div}
    if not sized:
        return summary
    aspects = [w / h for w, h in (i.size for i in sized if i.size)]
    summary["aspect_ratio"] = {"min": round(min(aspects), 3), "max": round(max(aspects), 3)}
    buckets: dict[str, dict[str, int]] = {}
    for res in sorted(set(opts.resolutions)):
        counts: Counter[str] = Counter()
        for image in sized:
            w, h = image.size  # type: ignore[misc]
            bucket = bucket_for(w, h, res, div, opts.scale, opts.square_crop)
            if bucket is None:
                scan.findings.append(error(image.rel, f"{w}x{h} is smaller than one "
                                                      f"{div}px cell at resolution {res}: "
                                                      "skipped", "use a larger image",
                                           "too_small"))
                continue
            counts[f"{bucket[0]}x{bucket[1]}"] += 1
            if w * h < res * res:
                scan.findings.append(warning(
                    image.rel, f"{w}x{h} is smaller than resolution {res}: upstream would "
                               f"upscale it, aitk trains it at {bucket[0]}x{bucket[1]}",
                    "use a larger source image or a lower resolution", "small_image"))
        buckets[str(res)] = dict(sorted(counts.items()))
    summary["buckets"] = buckets
    for image in sized:
        w, h = image.size  # type: ignore[misc]
        if max(w / h, h / w) > EXTREME_ASPECT:
            scan.findings.append(warning(image.rel, f"extreme aspect ratio {w}x{h}",
                                         "crop it closer to the subject", "extreme_aspect"))
    return summary


def _duplicate_findings(scan: _Scan) -> None:
    for digest, names in scan.hashes.items():
        if len(names) > 1:
            for name in names[1:]:
                scan.findings.append(warning(name, f"exact duplicate of {names[0]} "
                                                   f"(sha256 {digest[:12]})", "remove one",
                                             "duplicate"))


def _control_findings(opts: DatasetOptions, scan: _Scan) -> None:
    stems = {Path(i.rel).stem: i for i in scan.images}
    for control in opts.controls:
        if not control.is_dir():
            scan.findings.append(error(str(control), "control folder does not exist",
                                       code="missing_control_folder"))
            continue
        try:
            entries = folder_entries(control)
        except DatasetError as exc:
            scan.findings.append(error(str(control), str(exc), "check its permissions",
                                       "missing_control_folder"))
            continue
        found = {p.stem: p for p in entries
                 if is_regular_file(p) and p.suffix.lower() in IMAGE_EXTENSIONS}
        for stem, image in stems.items():
            if stem not in found:
                scan.findings.append(error(image.rel, f"no control image in {control}",
                                           f"add {control / stem}.png (any image type)",
                                           "missing_control"))
        for stem, path in found.items():
            if stem not in stems:
                scan.findings.append(warning(str(path), "control image without a training "
                                                        "image", code="orphan_control"))


def audit_dataset(opts: DatasetOptions) -> Report:
    report = Report("dataset", str(opts.folder))
    if not opts.folder.is_dir():
        report.findings.append(error(str(opts.folder), "dataset folder does not exist",
                                     "point folder_path at a folder of images",
                                     "missing_folder"))
        return report
    try:
        scan = _scan(opts)
    except DatasetError as exc:
        report.findings.append(error(str(opts.folder), str(exc), "check its permissions",
                                     "unlisted_folder"))
        return report
    if not scan.images and not scan.videos:
        what = (f"images or videos ({', '.join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)})"
                if opts.videos else f"images ({', '.join(IMAGE_EXTENSIONS)})")
        scan.findings.insert(0, error(str(opts.folder), f"no usable {what}",
                                      code="no_images"))
    summary: dict[str, object] = {"files": dict(sorted(scan.kinds.items())),
                                  "usable_images": len(scan.images)}
    if opts.videos:
        summary["videos"] = scan.videos
    summary.update(_caption_findings(opts, scan))
    summary.update(_size_findings(opts, scan))
    _duplicate_findings(scan)
    _control_findings(opts, scan)
    report.summary = summary
    report.findings = scan.findings
    return report
