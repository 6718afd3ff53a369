"""What one captioning run was asked to do: plain data, no torch (the command line and
the web UI's server can both build it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
# Worded for training captions: what is there, not "The image shows ...".
DEFAULT_PROMPT = ("Write a caption for this image for training an image model: one or two "
                  "sentences describing the subject, its appearance, the setting, the "
                  "lighting and the style. Start with the subject; do not begin with "
                  "\"The image shows\" or \"This is\".")
MAX_NEW_TOKENS = 160  # two sentences, with room to spare


@dataclass(frozen=True)
class CaptionSettings:
    dataset: Path
    model: str = DEFAULT_MODEL  # a local model folder or a Hugging Face hub id
    prompt: str = DEFAULT_PROMPT  # the instruction the model sees with each picture
    trigger: str | None = None  # prefixed to every new caption: "TRIGGER, caption"
    overwrite: bool = False  # replace captions that exist (default: only the missing)
    limit: int | None = None  # caption at most this many files (None: all)
    device: str | None = None  # cpu, cuda, cuda:N, mps; None: cuda when present, else cpu
    caption_ext: str = "txt"
    max_new_tokens: int = MAX_NEW_TOKENS

    @property
    def caption_suffix(self) -> str:
        ext = self.caption_ext
        return ext if ext.startswith(".") else f".{ext}"
