"""Flags after a prompt, as upstream (and sd-scripts) read them:

    "a cat on a sofa --n blurry, dark --w 768 --h 512 --seed 42 --cfg 5 --steps 30 --m -2"

`--n` negative prompt, `--w`/`--h` size, `--d`/`--seed` seed, `--l`/`--cfg` guidance,
`--s`/`--steps` sampling steps, `--m`/`--network_multiplier` the adapter's weight,
`--frames`/`--num_frames` and `--fps` (video archs). Upstream's flags for things aitk
does not do (`--p2`, `--n2`, `--gr`, `--a`, `--ref`, `--ev`) are dropped with a warning;
any other flag is an error (aitk.errors.PromptFlagError, a field error in a schema). Pure
and torch-free: the config check reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aitk.errors import PromptFlagError

# flag -> (field, type)
FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "n": ("negative_prompt", str), "w": ("width", int), "h": ("height", int),
    "d": ("seed", int), "seed": ("seed", int), "l": ("guidance_scale", float),
    "cfg": ("guidance_scale", float), "s": ("sample_steps", int),
    "steps": ("sample_steps", int), "m": ("network_multiplier", float),
    "network_multiplier": ("network_multiplier", float), "frames": ("num_frames", int),
    "num_frames": ("num_frames", int), "fps": ("fps", int),
}
UPSTREAM_ONLY = frozenset({"p2", "n2", "gr", "a", "ref", "ev", "extra_values"})


@dataclass(frozen=True)
class ParsedPrompt:
    prompt: str
    values: dict[str, Any] = field(default_factory=dict)  # field -> value
    dropped: tuple[str, ...] = ()  # upstream flags aitk does not act on


def parse_prompt(text: str) -> ParsedPrompt:
    head, *parts = text.split("--")
    values: dict[str, Any] = {}
    dropped = []
    for part in parts:
        flag, _, content = part.strip().partition(" ")
        content = content.strip()
        if flag in UPSTREAM_ONLY:
            dropped.append(flag)
            continue
        if flag not in FLAGS:
            raise PromptFlagError(f"unknown prompt flag --{flag} (known: "
                                  f"{', '.join('--' + f for f in FLAGS)})")
        name, kind = FLAGS[flag]
        try:
            values[name] = kind(content)
        except ValueError:
            raise PromptFlagError(f"prompt flag --{flag} needs a {kind.__name__}, got "
                                  f"{content!r}") from None
        if name in ("width", "height", "sample_steps", "num_frames", "fps") and \
                values[name] < 1:
            raise PromptFlagError(f"prompt flag --{flag} must be at least 1, got {content}")
    return ParsedPrompt(head.strip(), values, tuple(dropped))
