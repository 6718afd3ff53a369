"""Video clips for video datasets: which frames a clip takes, and decoding them.

Decoder: PyAV (`av` on PyPI). Its wheels bundle FFmpeg's own libraries, so the package
installer's hash check of the wheel is what verifies that FFmpeg, on every platform the
wheels cover, and it decodes in-process from an already opened file object: the dataset's
bounded, non-blocking `open_input` (no FIFO, no device, a size limit) guards videos
exactly as it guards images, and frames come back counted, one by one, in order. (A
pipe to the `ffmpeg` program would need the path, a child process per clip and a seekable
file for most mp4s; the program stays for users' own conversions.)

Frame rules (upstream's keys, `datasets[].num_frames / fps / shrink_video_to_frames`):

- `shrink_video_to_frames: true` (default): `num_frames` spread evenly over the whole
  clip, first and last frame included (index i * (total - 1) / (num_frames - 1),
  rounded half up).
- `false`: `num_frames` consecutive frames at `fps`, i.e. every round(video fps / fps)-th
  frame from the first one. aitk always starts at frame 0 (upstream picks a random
  start), so a clip's pixels are the same every epoch and its latents can be cached. A
  clip too short for that at `fps` is spread over its whole length instead (as upstream).
- A video with fewer frames than `num_frames` is skipped and reported (upstream would
  repeat frames, which teaches a stutter).
- `auto_frame_count: true` (upstream's meaning): each video trains at its own length,
  num_frames ignored: its duration at the dataset's `fps`, snapped to 4k+1 frames
  (the VAE's 4 frames per latent frame plus the first). With
  `trim_auto_frame_count_tail` (default) the count is rounded down so it fits inside
  the video and the frames are taken at `fps` from the start (real-time motion, the
  leftover tail dropped); without it the count is rounded to the 4k+1 at or below the
  duration and spread over the whole clip. Clips then batch with clips of their length.

The frames chosen at scan time are stored in the dataset item, so loading and the latent
cache key depend on exactly those frames.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from PIL import Image

from aitk.errors import UnreadableVideo

MAX_VIDEO_BYTES = 4 * 2**30
MAX_VIDEO_FRAMES = 20_000  # counted at scan: ~14 minutes at 24 fps


@dataclass(frozen=True)
class ClipSpec:
    """A video dataset's frame settings (num_frames is 4k+1, checked by the config)."""

    num_frames: int
    fps: float = 24.0
    shrink: bool = True
    auto: bool = False  # auto_frame_count: num_frames from each video's length
    trim_tail: bool = True  # trim_auto_frame_count_tail
    audio: bool = False  # do_audio on an arch that trains sound (aitk.data.audio)
    audio_normalize: bool = False  # its peak scaled to full scale (upstream's key)
    audio_preserve_pitch: bool = False  # a stretched soundtrack keeps its pitch


TEMPORAL_COMPRESSION = 4  # video VAE frames per latent frame (after the first)


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    frames: int  # counted by decoding every frame
    fps: float | None  # the stream's average rate; None when the file does not say


def spread(total: int, count: int) -> list[int]:
    """`count` indices evenly over 0..total-1, both ends included (total >= count)."""
    if count == 1:
        return [0]
    # round half up, in integers: i * (total - 1) / (count - 1) + 1/2
    return [(2 * i * (total - 1) + count - 1) // (2 * (count - 1)) for i in range(count)]


def fits_at_fps(info: VideoInfo, spec: ClipSpec) -> bool:
    return (spec.num_frames - 1) * _stride(info, spec) < info.frames


def _stride(info: VideoInfo, spec: ClipSpec) -> int:
    if not info.fps:
        return 1
    return max(1, round(info.fps / spec.fps))


def auto_frame_count(info: VideoInfo, spec: ClipSpec) -> int:
    """A video's frame count under auto_frame_count (see the module docstring)."""
    rate = info.fps or spec.fps
    wanted = int(info.frames / rate * spec.fps)
    if spec.trim_tail:
        wanted = max(0, wanted - 1)
    return wanted // TEMPORAL_COMPRESSION * TEMPORAL_COMPRESSION + 1


def frame_indices(info: VideoInfo, spec: ClipSpec) -> tuple[int, ...]:
    """The frames a clip takes (see the module docstring); UnreadableVideo when the
    video has fewer than `num_frames`."""
    if spec.auto:
        n = auto_frame_count(info, spec)
        if spec.trim_tail:
            ratio = (info.fps / spec.fps) if info.fps else 1.0
            return tuple(min(round(i * ratio), info.frames - 1) for i in range(n))
        n = min(n, (info.frames - 1) // TEMPORAL_COMPRESSION * TEMPORAL_COMPRESSION + 1)
        return tuple(spread(info.frames, n))
    n = spec.num_frames
    if info.frames < n:
        raise UnreadableVideo(f"{info.frames} frames, fewer than num_frames {n}")
    if not spec.shrink and fits_at_fps(info, spec):
        step = _stride(info, spec)
        return tuple(i * step for i in range(n))
    return tuple(spread(info.frames, n))


def _av_errors() -> tuple[type[BaseException], ...]:
    import av

    return (av.FFmpegError, IndexError, ValueError, EOFError)


def _frames(fh: BinaryIO, max_pixels: int) -> Iterator[tuple[int, float | None, object]]:
    """(index, stream fps, av.VideoFrame) for every frame of the first video stream."""
    import av

    with av.open(fh, mode="r") as container:
        if not container.streams.video:
            raise UnreadableVideo("no video stream")
        stream = container.streams.video[0]
        w, h = stream.codec_context.width, stream.codec_context.height
        if w * h > max_pixels:
            raise UnreadableVideo(f"{w}x{h} pixels a frame, more than the {max_pixels}-pixel "
                                  "limit")
        stream.thread_type = "AUTO"
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else None
        for index, frame in enumerate(container.decode(stream)):
            if index >= MAX_VIDEO_FRAMES:
                raise UnreadableVideo(f"more than {MAX_VIDEO_FRAMES} frames")
            yield index, fps, frame


def _upright(frame: object) -> Image.Image:
    """The frame as RGB, turned as the file's display matrix says (phone videos)."""
    image = frame.to_image()  # type: ignore[attr-defined]
    turn = int(getattr(frame, "rotation", 0) or 0) % 360
    return image.rotate(turn, expand=True) if turn else image


def probe(fh: BinaryIO, max_pixels: int) -> VideoInfo:
    """Decode every frame (as images are decoded whole at scan: a damaged file fails here,
    not mid-run) to count them; the size is the upright first frame's."""
    width = height = count = 0
    fps: float | None = None
    try:
        for index, rate, frame in _frames(fh, max_pixels):
            if index == 0:
                fps = rate
                turn = int(getattr(frame, "rotation", 0) or 0) % 180
                w, h = frame.width, frame.height  # type: ignore[attr-defined]
                width, height = (h, w) if turn else (w, h)
            count = index + 1
    except UnreadableVideo:
        raise
    except _av_errors() as exc:
        raise UnreadableVideo(_reason(exc)) from None
    if count == 0:
        raise UnreadableVideo("no frames")
    return VideoInfo(width, height, count, fps)


def read_frames(fh: BinaryIO, indices: Sequence[int], max_pixels: int
                ) -> Iterator[Image.Image]:
    """The frames at `indices` (ascending), upright RGB, decoded in order and one at a
    time (only the frames asked for are kept)."""
    wanted = set(indices)
    last = max(indices)
    found = 0
    try:
        for index, _, frame in _frames(fh, max_pixels):
            if index in wanted:
                found += 1
                yield _upright(frame)
            if index >= last:
                break
    except UnreadableVideo:
        raise
    except _av_errors() as exc:
        raise UnreadableVideo(_reason(exc)) from None
    if found < len(wanted):
        raise UnreadableVideo(f"fewer frames than at the scan (needs frame {last})")


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__
    return " ".join(str(text).split())[:200]


def is_video(path: Path) -> bool:
    from aitk.data.formats import VIDEO_EXTENSIONS

    return path.suffix.lower() in VIDEO_EXTENSIONS
