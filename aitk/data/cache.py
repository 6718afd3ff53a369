"""Latent and text-embedding caches, on disk and in memory.

A cache entry's key is a sha256 over everything that determines its content:

- latents: the image or video file's bytes, the processing (bucket, resize and crop;
  for a video arch the frame indices, which follow from num_frames, fps and
  shrink_video_to_frames; with `do_audio` the soundtrack's span), the model's
  `identity()` and `latent_space_version`; an entry of a clip with sound holds its
  audio latents too (`audio`), one without an `audio` tensor had no audio stream;
- text embeddings: the caption, the model's `identity()` and
  `text_embedding_space_version`.

So an edited image, a different model or a changed encoder never reuses a stale entry.
Entries are written atomically (aitk_common.files); an entry that cannot be read back is
reported and recomputed. Files live under `<cache_dir>/latents/` and
`<cache_dir>/text_embeds/` (default `<repo>/cache`, or `AITK_CACHE_DIR`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from aitk.data.buckets import resize_crop
from aitk.data.dataset import Item, load_audio, load_pixels
from aitk.errors import BadInputFile, PromptEmbedsFileError, UnreadableVideo
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk_common.files import atomic_write_bytes, sha256_file

CACHE_FORMAT = "1"  # bump when the layout of an entry changes
ENCODE_BATCH = 16  # captions per text-encoder call: bounded memory for big datasets


def default_cache_dir(repo_root: Path) -> Path:
    return Path(os.environ.get("AITK_CACHE_DIR") or repo_root / "cache")


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    return sha256_file(path)


def latent_key(item: Item, content_sha256: str, model_identity: str,
               space_version: str) -> str:
    plan = resize_crop(*item.size, item.bucket)
    fields = {"kind": "latent", "format": CACHE_FORMAT, "content": content_sha256,
              "processing": asdict(plan), "resample": "lanczos",
              "model": model_identity, "space": space_version}
    if item.frames is not None:  # absent for images: their existing entries stay valid
        fields["frames"] = list(item.frames)
    if any(item.flips):  # likewise absent for an unflipped item
        fields["flip"] = list(item.flips)
    if item.audio is not None:  # likewise absent without do_audio
        fields["audio"] = asdict(item.audio)
    return _digest(fields)


def text_key(caption: str, model_identity: str, space_version: str) -> str:
    return _digest({"kind": "text", "format": CACHE_FORMAT, "caption": caption,
                    "model": model_identity, "space": space_version})


def _entry(folder: Path, key: str, suffix: str = ".safetensors") -> Path:
    return folder / key[:2] / f"{key}{suffix}"


AudioOf = Callable[[Item], "torch.Tensor | None"]  # an item's audio latents, None: silent


class ItemAudio:
    """An item's audio latents: its soundtrack decoded as the model's `audio_format()`
    says and encoded with its `encode_audio`; None (said once per file) when the video
    has no audio stream, or one FFmpeg cannot decode: the clip trains video only (its
    frames decoded at the scan, so it is still a clip worth training)."""

    def __init__(self, model: Any, report: Callable[[str], None] = print) -> None:
        fmt = model.audio_format()
        assert fmt is not None, "ItemAudio needs an arch that trains sound"
        self.model, self.rate, self.channels, self.report = model, *fmt, report
        self._said: set[Path] = set()

    def _say(self, item: Item, why: str) -> None:
        if item.path not in self._said:
            self._said.add(item.path)
            self.report(f"{item.path}: {why}; this clip trains video only")

    def __call__(self, item: Item) -> torch.Tensor | None:
        try:
            pcm = load_audio(item, self.rate, self.channels)
        except (UnreadableVideo, BadInputFile) as exc:
            self._say(item, str(exc))
            return None
        if pcm is None:
            if item.audio is not None:
                self._say(item, "no audio track")
            return None
        with torch.no_grad():
            return self.model.encode_audio(torch.from_numpy(pcm),
                                           len(item.frames or (0,))).detach().cpu()


class LatentCache:
    """Clean latents per item: memory always, disk when `to_disk`; with `audio` each
    clip's audio latents too (`audio_of`)."""

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], model_identity: str,
                 space_version: str, folder: Path | None,
                 report: Callable[[str], None] = print, audio: AudioOf | None = None) -> None:
        self.encode = encode
        self.audio = audio
        self._audio: dict[tuple[Any, ...], torch.Tensor | None] = {}
        self.identity = model_identity
        self.space = space_version
        self.folder = folder
        self.report = report
        self._memory: dict[tuple[Any, ...], torch.Tensor] = {}
        self.computed = 0  # entries encoded in this process (tests and progress read it)

    def key(self, item: Item) -> str:
        return latent_key(item, file_digest(item.path), self.identity, self.space)

    def fill(self, items: Iterable[Item], progress: Callable[[], None] = lambda: None,
             stop: Callable[[], None] = lambda: None) -> None:
        for item in dict.fromkeys(items):  # repeats share one entry
            stop()
            slot = self._slot(item)
            self._memory[slot], self._audio[slot] = self._load_or_encode(item)
            progress()

    def _with_audio(self, item: Item) -> bool:
        return self.audio is not None and item.audio is not None

    def _load_or_encode(self, item: Item) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = self.key(item)
        path = _entry(self.folder, key) if self.folder is not None else None
        if path is not None and path.exists():
            try:
                entry = load_file(path)
                return entry["latent"], entry.get("audio")
            except Exception as exc:  # a torn or foreign file: recompute, never trust it
                self.report(f"latent cache entry {path.name} is unreadable ({exc}); "
                            "recomputing")
        with torch.no_grad():
            latent = self.encode(load_pixels(item).unsqueeze(0))[0].detach().cpu()
        sound = self.audio(item) if self._with_audio(item) else None  # type: ignore[misc]
        self.computed += 1
        if path is not None:
            tensors = {"latent": latent.contiguous()}
            if sound is not None:
                tensors["audio"] = sound.contiguous()
            atomic_write_bytes(path, save(tensors, metadata={"key": key}))
        return latent, sound

    @staticmethod
    def _slot(item: Item) -> tuple[Any, ...]:
        return item.path, item.bucket, item.frames, item.flips

    def get(self, items: Sequence[Item]) -> torch.Tensor:
        return torch.stack([self._memory[self._slot(i)] for i in items])

    def audio_of(self, item: Item) -> torch.Tensor | None:
        """A cached clip's audio latents (None: silent); an item the cache was not
        filled with (an augmented dataset's) is encoded now."""
        slot = self._slot(item)
        if slot in self._audio:
            return self._audio[slot]
        return self.audio(item) if self._with_audio(item) else None  # type: ignore[misc]


class TextEmbedCache:
    """Embeds per caption; disk entries via AdvancedPromptEmbeds.save/load."""

    def __init__(self, encode: Callable[[list[str]], dict[str, AdvancedPromptEmbeds]],
                 model_identity: str, space_version: str, folder: Path | None,
                 report: Callable[[str], None] = print) -> None:
        self.encode = encode
        self.identity = model_identity
        self.space = space_version
        self.folder = folder
        self.report = report
        self._memory: dict[str, AdvancedPromptEmbeds] = {}
        self.computed = 0

    def fill(self, captions: Iterable[str], stop: Callable[[], None] = lambda: None) -> None:
        missing: list[str] = []
        for caption in dict.fromkeys(captions):
            stop()
            loaded = self._load(caption)
            if loaded is None:
                missing.append(caption)
            else:
                self._memory[caption] = loaded
        for start in range(0, len(missing), ENCODE_BATCH):
            stop()
            chunk = missing[start:start + ENCODE_BATCH]
            fresh = self.encode(chunk)
            self.computed += len(chunk)
            for caption in chunk:
                embeds = fresh[caption].detach().to("cpu")
                if self.folder is not None:
                    embeds.save(self._path(caption))
                self._memory[caption] = embeds

    def _path(self, caption: str) -> Path:
        assert self.folder is not None
        return _entry(self.folder, text_key(caption, self.identity, self.space))

    def _load(self, caption: str) -> AdvancedPromptEmbeds | None:
        if self.folder is None:
            return None
        path = self._path(caption)
        if not path.exists():
            return None
        try:
            return AdvancedPromptEmbeds.load(path)
        except PromptEmbedsFileError as exc:
            self.report(f"text-embedding cache entry {path.name} is unreadable ({exc}); "
                        "recomputing")
            return None

    def __contains__(self, caption: str) -> bool:
        return caption in self._memory

    def get(self, captions: Sequence[str]) -> AdvancedPromptEmbeds:
        return AdvancedPromptEmbeds.cat([self._memory[c] for c in captions])

    def mapping(self) -> dict[str, AdvancedPromptEmbeds]:
        return dict(self._memory)
