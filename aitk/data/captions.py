"""Per-draw caption changes (upstream's dataset keys): a caption is a comma-separated
list of tokens, and each time an item is drawn

- `token_dropout_rate`: each token is dropped with that probability, except the first
  `keep_tokens` and the trigger word (upstream adds the trigger after dropout, so it
  never drops it);
- `random_triggers` (a list, or a file with one per line): `random_triggers_max` of them
  are appended (with a max above 1, a random count from 0 to that max, as upstream);
- `shuffle_tokens`: the tokens after the first `keep_tokens` are shuffled (kohya's
  meaning of keep_tokens, which upstream documents as "always keep"); the appended
  random triggers and the trigger word shuffle with the rest.

Caption dropout (the whole caption, aitk.data.dataset.dropped_captions) comes first.
`train.prompt_dropout_prob` (`dropped_prompts`) changes no text: it blanks an item's
prompt per text encoder when the batch is embedded live (BaseModel's
get_prompt_embeds_dropped).
Draws come from a generator keyed by (seed, stream, epoch, batch, position), so a
resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CaptionRules:
    shuffle_tokens: bool = False
    keep_tokens: int = 0
    token_dropout_rate: float = 0.0
    random_triggers: tuple[str, ...] = ()
    random_triggers_max: int = 1
    trigger: str | None = None  # never dropped

    @property
    def active(self) -> bool:
        return self.shuffle_tokens or self.token_dropout_rate > 0 or bool(self.random_triggers)


def tokens(caption: str) -> list[str]:
    return [t.strip() for t in caption.split(",") if t.strip()]


def vary_caption(caption: str, rules: CaptionRules, rng: np.random.Generator) -> str:
    """One draw of `caption` under `rules` (see the module docstring)."""
    if not rules.active or not caption:
        return caption
    parts = tokens(caption)
    keep = max(0, rules.keep_tokens)
    head, tail = parts[:keep], parts[keep:]
    if rules.token_dropout_rate > 0:
        draws = rng.random(len(tail))
        tail = [t for t, d in zip(tail, draws, strict=True)
                if t == rules.trigger or d >= rules.token_dropout_rate]
    if rules.random_triggers:
        count = rules.random_triggers_max
        if count > 1:
            count = int(rng.integers(0, count + 1))
        count = min(count, len(rules.random_triggers))
        if count:
            picked = rng.choice(len(rules.random_triggers), size=count, replace=False)
            tail += [rules.random_triggers[int(i)] for i in picked]
    if rules.shuffle_tokens:
        tail = [tail[int(i)] for i in rng.permutation(len(tail))]
    return ", ".join(head + tail)


def draw_generator(seed: int, stream: int, epoch: int, batch_index: int,
                   position: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, epoch, batch_index, position, 11])


def vary_batch(captions: Sequence[str], rules: Sequence[CaptionRules], seed: int,
               stream: int, epoch: int, batch_index: int) -> list[str]:
    return [vary_caption(c, r, draw_generator(seed, stream, epoch, batch_index, k))
            for k, (c, r) in enumerate(zip(captions, rules, strict=True))]


PromptBlanks = tuple[tuple[bool, ...], ...]  # per item, per text encoder: blank it


def dropped_prompts(seed: int, epoch: int, batch_index: int, p: float, *, items: int,
                    encoders: int, stream: int = 0, pass_: int = 0) -> PromptBlanks | None:
    """`train.prompt_dropout_prob` for one batch: per item, per text encoder, whether
    its prompt is blanked (each with probability `p`, independently, as upstream draws
    each encoder's list on its own), from (seed, stream, epoch, batch) alone --
    resumable. `pass_` 1 is the draw for the batch's diff_output_preservation prompts,
    which upstream encodes with a dropout of their own. None at p = 0: nothing is
    drawn."""
    if p <= 0.0:
        return None
    key = [seed, stream, epoch, batch_index, 19] + ([pass_] if pass_ else [])
    draws = np.random.default_rng(key).random((items, encoders))
    return tuple(tuple(bool(d < p) for d in row) for row in draws)


def embed_blanked(captions: list[str], blanks: PromptBlanks | None,
                  embed: Callable[..., Any],
                  control_embed: Callable[[list[str]], Any] | None = None) -> Any:
    """`captions` embedded with `dropped_prompts`' draw: through `embed(captions,
    blanks)` (the model blanks each encoder's part, BaseModel.get_prompt_embeds_dropped)
    or, for an edit model whose embeddings read the controls (`control_embed`), with a
    blanked item's whole caption as "". No blank drawn: the plain call, as without
    prompt dropout (a cached embedder takes the captions alone)."""
    if blanks is None or not any(b for row in blanks for b in row):
        return embed(captions) if control_embed is None else control_embed(captions)
    if control_embed is not None:
        return control_embed(["" if any(row) else c
                              for c, row in zip(captions, blanks, strict=True)])
    return embed(captions, blanks)
