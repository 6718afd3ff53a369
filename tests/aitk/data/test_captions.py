"""Per-draw caption changes (aitk.data.captions): shuffle keeps keep_tokens in place,
token dropout spares the kept tokens and the trigger, random triggers are appended;
every draw is keyed, so it is the same on a second pass."""

from __future__ import annotations

import numpy as np

from aitk.data.captions import CaptionRules, tokens, vary_batch, vary_caption

CAPTION = "p1xel, a red circle, on grass, at noon, soft light, wide shot, film grain"


def draws(rules: CaptionRules, n: int = 200) -> list[str]:
    return [vary_caption(CAPTION, rules, np.random.default_rng([1, i])) for i in range(n)]


def test_shuffle_keeps_the_first_keep_tokens_in_place_and_moves_the_rest():
    out = draws(CaptionRules(shuffle_tokens=True, keep_tokens=2))
    original = tokens(CAPTION)
    for caption in out:
        parts = tokens(caption)
        assert parts[:2] == original[:2]
        assert sorted(parts[2:]) == sorted(original[2:])  # nothing lost or added
    assert len({c for c in out}) > 50  # the tail really is shuffled
    firsts = {tokens(c)[2] for c in out}
    assert firsts == set(original[2:])  # any tail token can come first


def test_without_keep_tokens_every_token_moves():
    out = draws(CaptionRules(shuffle_tokens=True))
    assert {tokens(c)[0] for c in out} == set(tokens(CAPTION))


def test_token_dropout_spares_kept_tokens_and_the_trigger():
    rules = CaptionRules(token_dropout_rate=0.5, keep_tokens=1, trigger="at noon")
    out = draws(rules, 400)
    original = tokens(CAPTION)
    for caption in out:
        parts = tokens(caption)
        assert parts[0] == original[0] and "at noon" in parts
        assert [t for t in original if t in parts] == parts  # order kept, no shuffle
    kept = np.mean([len(tokens(c)) - 2 for c in out]) / (len(original) - 2)
    assert 0.4 < kept < 0.6  # each other token survives half the time
    assert draws(CaptionRules(token_dropout_rate=1.0, keep_tokens=2))[0] == \
        "p1xel, a red circle"


def test_random_triggers_are_appended_up_to_the_max():
    pool = ("ohwx", "sks", "zkz")
    one = draws(CaptionRules(random_triggers=pool))
    assert all(len(tokens(c)) == len(tokens(CAPTION)) + 1 and tokens(c)[-1] in pool
               for c in one)
    upto = draws(CaptionRules(random_triggers=pool, random_triggers_max=3), 300)
    added = {len(tokens(c)) - len(tokens(CAPTION)) for c in upto}
    assert added == {0, 1, 2, 3}  # upstream: a random count from 0 to the max


def test_draws_are_keyed_and_inactive_rules_change_nothing():
    rules = [CaptionRules(shuffle_tokens=True, token_dropout_rate=0.3)] * 3
    captions = [CAPTION, "a, b, c, d", ""]
    first = vary_batch(captions, rules, 7, 0, 2, 5)
    assert vary_batch(captions, rules, 7, 0, 2, 5) == first
    assert vary_batch(captions, rules, 7, 0, 2, 6) != first
    assert first[2] == ""  # a dropped caption stays empty
    assert vary_batch(captions, [CaptionRules()] * 3, 7, 0, 2, 5) == captions
