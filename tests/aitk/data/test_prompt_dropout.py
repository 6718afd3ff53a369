"""train.prompt_dropout_prob's draw (aitk.data.captions.dropped_prompts) and its way into
the batch: per batch, per item, per text encoder, from (seed, stream, epoch, batch)
alone, and no draw at all at 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aitk.data import captions as captions_module
from aitk.data.batches import BatchSource
from aitk.data.captions import dropped_prompts
from aitk.data.dataset import Item


def test_the_draw_is_a_function_of_its_key() -> None:
    a = dropped_prompts(3, 1, 5, 0.5, items=4, encoders=2)
    assert a == dropped_prompts(3, 1, 5, 0.5, items=4, encoders=2)
    assert len(a) == 4 and all(len(row) == 2 for row in a)
    assert all(isinstance(b, bool) for row in a for b in row)
    others = {dropped_prompts(s, e, i, 0.5, items=4, encoders=2, stream=st)
              for s, e, i, st in ((4, 1, 5, 0), (3, 2, 5, 0), (3, 1, 6, 0), (3, 1, 5, 1))}
    assert len(others - {a}) >= 3  # each part of the key changes the draw


def test_zero_draws_nothing_and_one_blanks_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rng(*args, **kwargs):
        raise AssertionError("drew at p = 0")

    with monkeypatch.context() as mp:
        mp.setattr(captions_module.np.random, "default_rng", no_rng)
        assert dropped_prompts(1, 0, 0, 0.0, items=3, encoders=2) is None
    assert dropped_prompts(1, 0, 0, 1.0, items=3, encoders=2) == ((True, True),) * 3


def test_the_rate_is_p_and_encoders_draw_independently() -> None:
    rows = np.array([row for b in range(2000)
                     for row in dropped_prompts(11, 0, b, 0.3, items=2, encoders=2)])
    assert rows.shape == (4000, 2)
    assert abs(rows.mean() - 0.3) < 0.02
    both = (rows[:, 0] & rows[:, 1]).mean()
    assert abs(both - 0.09) < 0.02  # independent: P(both) = p * p, not p
    assert abs(rows[:, 0].mean() - rows[:, 1].mean()) < 0.03


class Recorder:
    """An embed function that writes down what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], object]] = []

    def __call__(self, captions: list[str], blanks=None) -> str:
        self.calls.append((list(captions), blanks))
        return "embeds"


def items(tmp_path: Path) -> list[Item]:
    return [Item(tmp_path / f"{k}.png", f"caption {k}", (8, 8), (8, 8)) for k in range(4)]


def source(tmp_path: Path, embed: Recorder, p: float, encoders: int = 2) -> BatchSource:
    return BatchSource(items(tmp_path), 2, 5, lambda its: torch.zeros(len(its), 1, 1, 1),
                       lambda px: px, embed, prompt_dropout=p, prompt_encoders=encoders)


def test_the_batch_carries_the_draw_and_the_embedder_gets_it(tmp_path: Path) -> None:
    embed = Recorder()
    data = source(tmp_path, embed, 1.0)
    batch = data.next()
    assert batch.prompt_blanks == ((True, True), (True, True))
    assert batch.captions == [i.caption for i in batch.items]  # upstream: text unchanged
    assert embed.calls == [(batch.captions, batch.prompt_blanks)]


def test_p_zero_embeds_as_before(tmp_path: Path) -> None:
    embed = Recorder()
    batch = source(tmp_path, embed, 0.0).next()
    assert batch.prompt_blanks is None
    assert embed.calls == [(batch.captions, None)]


def test_a_resumed_source_draws_the_same_blanks(tmp_path: Path) -> None:
    straight = source(tmp_path, Recorder(), 0.5)
    draws = [straight.next().prompt_blanks for _ in range(6)]
    first = source(tmp_path, Recorder(), 0.5)
    head = [first.next().prompt_blanks for _ in range(3)]
    resumed = source(tmp_path, Recorder(), 0.5)
    resumed.load_state_dict(first.state_dict())
    assert head + [resumed.next().prompt_blanks for _ in range(3)] == draws
    assert any(any(b for row in d for b in row) for d in draws)


def test_an_edit_models_control_embedder_gets_the_blanked_items_as_empty(
        tmp_path: Path) -> None:
    from PIL import Image

    control = tmp_path / "control.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(control)
    pool = [Item(tmp_path / f"{k}.png", f"caption {k}", (8, 8), (8, 8), controls=(control,))
            for k in range(4)]
    seen: list[list[str]] = []

    def control_embeds(captions, batch_items, images):
        seen.append(list(captions))
        return "embeds"

    data = BatchSource(pool, 2, 5, lambda its: torch.zeros(len(its), 1, 1, 1),
                       lambda px: px, Recorder(), control_embeds, prompt_dropout=0.5)
    batches = [data.next() for _ in range(8)]
    for batch, shown in zip(batches, seen, strict=True):
        assert batch.prompt_blanks is not None
        assert shown == ["" if row[0] else c
                         for c, row in zip(batch.captions, batch.prompt_blanks, strict=True)]
    assert "" in sum(seen, []) and any(s != "" for s in sum(seen, []))


def test_the_preservation_prompts_draw_afresh() -> None:
    """pass_ 1 (the diff_output_preservation prompts) is its own draw, as reproducible;
    pass_ 0 keeps the batch's own draw as it was."""
    from aitk.data.captions import dropped_prompts

    own = dropped_prompts(3, 0, 5, 0.5, items=64, encoders=2)
    dop = dropped_prompts(3, 0, 5, 0.5, items=64, encoders=2, pass_=1)
    assert dop == dropped_prompts(3, 0, 5, 0.5, items=64, encoders=2, pass_=1)
    assert own == dropped_prompts(3, 0, 5, 0.5, items=64, encoders=2, pass_=0)
    assert dop != own
    assert dropped_prompts(3, 0, 5, 0.0, items=4, encoders=1, pass_=1) is None
