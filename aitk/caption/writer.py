"""A caption as it goes into the file, and the write itself.

The model's answer is cleaned (one line, no control characters, the quotes some models
wrap it in dropped), the trigger word put in front ("TRIGGER, caption") unless the
caption already starts with it, and the file replaced atomically through
aitk_common.files: a stop or a crash leaves the old caption or the new one, never half
of one.
"""

from __future__ import annotations

import re
from pathlib import Path

from aitk_common.files import atomic_write_text

QUOTES = "\"'`“”‘’"


def clean(answer: str) -> str:
    text = " ".join("".join(c for c in answer if c.isprintable() or c.isspace()).split())
    if len(text) >= 2 and text[0] in QUOTES and text[-1] in QUOTES:
        text = text[1:-1].strip()
    return text


def caption_text(answer: str, trigger: str | None) -> str:
    text = clean(answer)
    trigger = (trigger or "").strip()
    if not trigger or re.match(rf"{re.escape(trigger)}(?!\w)", text):
        return text or trigger
    return f"{trigger}, {text}" if text else trigger


def write_caption(path: Path, text: str) -> None:
    """Replace `path` with `text` (a link there is replaced, not followed)."""
    atomic_write_text(path, text)
