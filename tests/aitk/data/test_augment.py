"""Augmentation (aitk.data.augment): flip_x/flip_y add mirrored copies whose pixels and
latent-cache entries really are mirrored; augments are random per draw, keyed, and an
unknown name is a config error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aitk.config.loading import ConfigError
from aitk.data.augment import augment, color_jitter
from aitk.data.cache import LatentCache
from aitk.data.dataset import load_pixels
from aitk.run.assembly import Reporter, scan_datasets
from tests.aitk.test_config import example_raw, parse, proc


def gradient_image(path: Path, size=(48, 32)) -> Path:
    """Left-to-right and top-to-bottom ramps: every flip shows."""
    w, h = size
    x = np.linspace(0, 255, w)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h)[:, None].repeat(w, 1)
    arr = np.stack([x, y, np.full_like(x, 90)], -1).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, "RGB").save(path)
    path.with_suffix(".txt").write_text("a ramp")
    return path


def scanned(tmp_path: Path, **dataset):
    gradient_image(tmp_path / "ds" / "ramp.png")
    raw = example_raw()
    proc(raw)["datasets"] = [{"folder_path": str(tmp_path / "ds"), "resolution": [32],
                              **dataset}]
    p = parse(raw).job.config.process[0]
    return scan_datasets(p, 8, Reporter(__import__("io").StringIO()))


def test_flips_add_mirrored_copies_with_mirrored_pixels(tmp_path: Path):
    items = scanned(tmp_path, flip_x=True, flip_y=True)
    assert [i.flips for i in items] == [(False, False), (True, False), (False, True),
                                        (True, True)]
    plain, fx, fy, fxy = (load_pixels(i) for i in items)
    assert torch.equal(fx, plain.flip(-1))
    assert torch.equal(fy, plain.flip(-2))
    assert torch.equal(fxy, plain.flip(-1).flip(-2))


def test_flipped_copies_have_their_own_latent_cache_entries(tmp_path: Path):
    items = scanned(tmp_path, flip_x=True)
    cache = LatentCache(lambda x: x[:, :1], "m", "v", tmp_path / "cache")
    cache.fill(items)
    assert cache.computed == 2 and cache.key(items[0]) != cache.key(items[1])
    latents = cache.get(items)
    assert torch.equal(latents[1], latents[0].flip(-1))
    unflipped_key = cache.key(scanned(tmp_path / "again")[0])
    assert unflipped_key == cache.key(items[0])  # existing entries stay valid


def test_augments_change_pixels_per_draw_and_are_keyed():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3),
                                                            dtype=np.uint8), "RGB")
    a = np.asarray(augment(img, ["ColorJitter"], np.random.default_rng(1)))
    b = np.asarray(augment(img, ["ColorJitter"], np.random.default_rng(1)))
    c = np.asarray(augment(img, ["ColorJitter"], np.random.default_rng(2)))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(a, np.asarray(img))
    assert a.shape == (16, 16, 3)


def test_color_jitter_stays_within_its_documented_range():
    grey = Image.new("RGB", (8, 8), (128, 128, 128))
    for seed in range(50):
        value = np.asarray(color_jitter(grey, np.random.default_rng(seed))).mean()
        # brightness 0.8..1.2 bounds a flat grey image (contrast/saturation keep it)
        assert 128 * 0.8 - 2 <= value <= 128 * 1.2 + 2


def test_random_equalize_applies_about_a_fifth_of_the_time():
    img = Image.fromarray(np.linspace(60, 120, 64 * 64).astype(np.uint8).reshape(64, 64)
                          ).convert("RGB")  # a narrow histogram that equalising widens
    changed = sum(not np.array_equal(np.asarray(augment(img, ["RandomEqualize"],
                                                        np.random.default_rng(s))),
                                     np.asarray(img)) for s in range(400))
    assert 50 < changed < 110


def test_an_unknown_augment_is_a_config_error_naming_the_valid_ones():
    raw = example_raw()
    proc(raw)["datasets"][0]["augments"] = ["ColorJitter", "RandomBlur"]
    with pytest.raises(ConfigError) as info:
        parse(raw)
    (path, message), = info.value.records
    assert path == "config.process[0].datasets[0].augments[1]"
    assert "'ColorJitter'" in message and "'RandomEqualize'" in message
