"""Aspect buckets and the seeded, resumable batch order."""

from __future__ import annotations

import pytest

from aitk.data.buckets import (
    BatchSampler,
    bucket_for,
    epoch_batches,
    random_resize_crop,
    resize_crop,
)


@pytest.mark.parametrize("size", [(64, 48), (1024, 768), (3000, 1000), (500, 2000), (97, 97)])
@pytest.mark.parametrize("resolution", [64, 256, 512])
def test_bucket_is_divisible_capped_and_never_upscaled(size, resolution):
    w, h = size
    bw, bh = bucket_for(w, h, resolution, 16)
    assert bw % 16 == 0 and bh % 16 == 0
    assert bw <= w and bh <= h
    assert bw * bh <= resolution * resolution


def test_bucket_keeps_the_aspect_ratio_roughly():
    bw, bh = bucket_for(1600, 900, 512, 16)
    assert abs(bw / bh - 16 / 9) < 0.1
    assert (bw, bh) == (672, 384)


def test_small_image_trains_at_its_own_size_and_tiny_one_is_rejected():
    assert bucket_for(100, 70, 512, 16) == (96, 64)
    assert bucket_for(10, 300, 512, 16) is None


def test_several_resolutions_give_several_buckets():
    assert bucket_for(200, 100, 64, 8) != bucket_for(200, 100, 128, 8)


def test_resize_crop_covers_the_bucket_without_upscaling():
    plan = resize_crop(100, 70, (96, 64))
    assert (plan.width, plan.height) == (96, 64)
    assert plan.resize_w <= 100 and plan.resize_h <= 70
    assert plan.resize_w >= 96 and plan.resize_h >= 64
    assert plan.left + plan.width <= plan.resize_w and plan.top + plan.height <= plan.resize_h


def test_epoch_batches_cover_every_item_once_and_never_mix_buckets():
    buckets = [(64, 64)] * 5 + [(64, 32)] * 3
    batches = epoch_batches(buckets, 2, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(8))
    for b in batches:
        assert len({buckets[i] for i in b}) == 1


def test_order_is_a_function_of_seed_and_epoch():
    buckets = [(64, 64)] * 10
    assert epoch_batches(buckets, 2, 1, 0) == epoch_batches(buckets, 2, 1, 0)
    assert epoch_batches(buckets, 2, 1, 0) != epoch_batches(buckets, 2, 1, 1)
    assert epoch_batches(buckets, 2, 1, 0) != epoch_batches(buckets, 2, 2, 0)


def test_sampler_resumes_exactly_from_its_state():
    buckets = [(64, 64)] * 5 + [(32, 64)] * 2
    straight = BatchSampler(buckets, 2, seed=3)
    expected = [straight.next() for _ in range(11)]
    first = BatchSampler(buckets, 2, seed=3)
    got = [first.next() for _ in range(4)]
    resumed = BatchSampler(buckets, 2, seed=3)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next() for _ in range(7)]
    assert got == expected
    assert expected[-1][0] >= 2  # crossed epoch boundaries


def test_scale_shrinks_the_image_before_it_is_bucketed():
    assert bucket_for(1024, 768, 1024, 16) == (1024, 768)
    assert bucket_for(1024, 768, 1024, 16, scale=0.5) == (512, 384)
    assert bucket_for(1024, 768, 256, 16, scale=0.5) == bucket_for(1024, 768, 256, 16)
    assert bucket_for(40, 40, 512, 16, scale=0.25) is None  # 10 px: under one cell


def test_square_crop_trains_a_centred_square_of_the_resolution():
    assert bucket_for(1000, 600, 512, 16, square=True) == (512, 512)
    plan = resize_crop(1000, 600, (512, 512))  # the short side to 512, the centre kept
    assert (plan.resize_w, plan.resize_h, plan.left, plan.top) == (853, 512, 170, 0)
    assert bucket_for(300, 200, 512, 16, square=True) == (192, 192)  # never upscaled
    assert bucket_for(600, 1000, 1024, 16, scale=0.5, square=True) == (288, 288)


def _rng(seed: int):
    import numpy as np

    return np.random.default_rng(seed)


@pytest.mark.parametrize("rescale", [False, True])
def test_random_crops_stay_inside_and_follow_their_generator(rescale: bool):
    plans = [random_resize_crop(200, 100, (96, 40), _rng(s), rescale) for s in range(40)]
    for p in plans:
        assert (p.width, p.height) == (96, 40)
        assert 96 <= p.resize_w <= 200 and 40 <= p.resize_h <= 100
        assert 0 <= p.left <= p.resize_w - 96 and 0 <= p.top <= p.resize_h - 40
    assert plans == [random_resize_crop(200, 100, (96, 40), _rng(s), rescale)
                     for s in range(40)]  # the same generator, the same crop
    assert len({(p.left, p.top) for p in plans}) > 5
    sizes = {(p.resize_w, p.resize_h) for p in plans}
    if rescale:  # a random zoom: short sides from 48 (covers the bucket) up to 100
        assert len(sizes) > 5 and min(h for _, h in sizes) < 60 < max(h for _, h in sizes)
        assert {p.resize_w for p in plans} != {96}
    else:  # random_crop alone keeps the centre crop's resize (96x48), as upstream
        assert sizes == {(96, 48)}
        assert {p.top for p in plans} == set(range(9))  # anywhere in the 8 px of slack
