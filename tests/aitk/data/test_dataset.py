"""Caption rules, reporting of bad inputs, and pixels at the bucket size."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from aitk.data.dataset import (
    DatasetError,
    apply_trigger,
    dropped_captions,
    load_pixels,
    scan_folder,
)
from tests.aitk.aitk_testing import write_image


def test_trigger_tag_is_replaced():
    assert apply_trigger("[trigger] in a field", "sks") == "sks in a field"


def test_trigger_is_prepended_when_absent_and_kept_when_present():
    assert apply_trigger("a dog", "sks") == "sks, a dog"
    assert apply_trigger("a sks dog", "sks") == "a sks dog"
    assert apply_trigger("", "sks") == "sks"


def test_trigger_tag_without_a_trigger_word_is_removed():
    assert apply_trigger("[trigger], a dog", None) == "a dog"
    assert apply_trigger("a dog", None) == "a dog"


def test_scan_reads_captions_and_applies_the_trigger(image_folder: Path):
    items = scan_folder(image_folder, trigger_word="zz", resolutions=[32], divisibility=8)
    captions = {i.path.name: i.caption for i in items}
    assert captions == {"a.png": "zz, a red thing", "b.jpg": "zz a green thing",
                        "c.png": "zz, a blue thing"}
    assert {i.path.name: i.bucket for i in items}["a.png"] == (32, 24)


def test_missing_caption_uses_default_and_is_reported_once(image_folder: Path):
    (image_folder / "a.txt").unlink()
    reports: list[str] = []
    items = scan_folder(image_folder, default_caption="a photo", resolutions=[32, 48],
                        divisibility=8, report=reports.append)
    assert [i.caption for i in items if i.path.name == "a.png"] == ["a photo", "a photo"]
    assert len([r for r in reports if "a.png" in r]) == 1
    assert "no caption file" in reports[0]


def test_unreadable_image_is_skipped_and_reported(image_folder: Path):
    (image_folder / "broken.png").write_bytes(b"not an image")
    reports: list[str] = []
    items = scan_folder(image_folder, resolutions=[32], divisibility=8, report=reports.append)
    assert "broken.png" not in {i.path.name for i in items}
    assert len(items) == 3
    assert any("broken.png" in r and "unreadable" in r for r in reports)


@pytest.mark.parametrize("name", ["cut.jpg", "cut.png"])
def test_truncated_image_is_skipped_at_scan_and_reported(image_folder: Path, name: str):
    # The header is intact, so only decoding the pixels finds the damage.
    noise = Image.effect_noise((64, 64), 64).convert("RGB")
    buf = io.BytesIO()
    noise.save(buf, format="JPEG" if name.endswith(".jpg") else "PNG")
    (image_folder / name).write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])
    (image_folder / name).with_suffix(".txt").write_text("cut")
    reports: list[str] = []
    items = scan_folder(image_folder, resolutions=[32], divisibility=8, report=reports.append)
    assert name not in {i.path.name for i in items}
    assert any(name in r and "unreadable" in r for r in reports)
    for item in items:  # what the scan kept decodes
        load_pixels(item)


def test_empty_or_missing_dataset_is_an_error(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="no usable images"):
        scan_folder(tmp_path / "empty")
    with pytest.raises(DatasetError, match="does not exist"):
        scan_folder(tmp_path / "absent")


def test_num_repeats_and_several_resolutions_multiply_items(image_folder: Path):
    items = scan_folder(image_folder, resolutions=[32, 48], divisibility=8, num_repeats=3)
    assert len(items) == 3 * 2 * 3


def test_webp_and_jpeg_extensions_are_found(tmp_path: Path):
    write_image(tmp_path / "x.webp", caption="w")
    write_image(tmp_path / "y.jpeg", caption="j")
    assert {i.path.name for i in scan_folder(tmp_path, resolutions=[32], divisibility=8)} \
        == {"x.webp", "y.jpeg"}


def test_pixels_are_in_range_at_the_bucket_size(image_folder: Path):
    item = next(i for i in scan_folder(image_folder, resolutions=[32], divisibility=8)
                if i.path.name == "a.png")
    px = load_pixels(item)
    assert px.shape == (3, 24, 32)
    assert px.min() >= -1 and px.max() <= 1
    assert px[0].mean() > 0.5  # red


def test_caption_dropout_is_seeded_and_follows_the_rate():
    assert dropped_captions(1, 0, 5, [0.5] * 8) == dropped_captions(1, 0, 5, [0.5] * 8)
    assert dropped_captions(1, 0, 5, [0.0] * 8) == [False] * 8
    assert dropped_captions(1, 0, 5, [1.0] * 8) == [True] * 8
    draws = [d for b in range(200) for d in dropped_captions(1, 0, b, [0.25] * 4)]
    assert 0.18 < sum(draws) / len(draws) < 0.32
