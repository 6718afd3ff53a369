"""Caption rules, reporting of bad inputs, and pixels at the bucket size."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from aitk.data.dataset import (
    MAX_CAPTION_BYTES,
    apply_trigger,
    dropped_captions,
    load_pixels,
    replace_text,
    scan_folder,
)
from aitk.errors import DatasetError
from tests.aitk.aitk_testing import REPO, write_image


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


def test_replacements_change_the_caption_text_in_order():
    pairs = [("red", "crimson"), ("crimson thing", "rose"), ("  ", " ")]
    assert replace_text("a red thing,  red", pairs) == "a rose, crimson"
    assert replace_text("Red", [("red", "blue")]) == "Red"  # case-sensitive, as upstream
    assert replace_text("a red thing", [("red ", "")]) == "a thing"


def test_a_dataset_trains_with_its_replaced_captions(image_folder: Path):
    from aitk.config.schema import DatasetConfig

    ds = DatasetConfig(folder_path=str(image_folder),
                       replacements=["red|crimson", "[trigger]|a photo of [trigger]"])
    items = scan_folder(image_folder, trigger_word="zz", resolutions=[32], divisibility=8,
                        replacements=ds.replacement_pairs)
    captions = {i.path.name: i.caption for i in items}
    assert captions["a.png"] == "zz, a crimson thing"
    assert captions["b.jpg"] == "a photo of zz a green thing"  # before the trigger rules


@pytest.mark.parametrize("bad", ["red", "a|b|c", "|blue"])
def test_a_replacement_without_one_bar_is_a_config_error(tmp_path: Path, bad: str):
    from pydantic import ValidationError

    from aitk.config.schema import DatasetConfig

    with pytest.raises(ValidationError, match="from\\|to"):
        DatasetConfig(folder_path=str(tmp_path), replacements=[bad])


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


# ---- hostile inputs: read bounded and without blocking, reported once, skipped --------
def png_declaring(path: Path, width: int, height: int) -> None:
    """A small valid PNG whose header claims width x height (CRC fixed up)."""
    import struct
    import zlib

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    ihdr = 8 + 8  # signature, then length + "IHDR"
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(data[ihdr - 4:ihdr + 13])))
    path.write_bytes(bytes(data))


SCAN_IN_A_CHILD = """
import json, resource, sys
from pathlib import Path
# Bounded memory: an endless caption read ends in MemoryError instead of eating the box.
resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
from aitk.data.dataset import scan_folder
reports = []
items = scan_folder(Path(sys.argv[1]), resolutions=[32], divisibility=8,
                    report=reports.append)
print(json.dumps({"items": sorted({i.path.name: i.caption for i in items}.items()),
                  "reports": reports}))
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_bombs_fifos_and_endless_captions_are_reported_once_and_skipped(tmp_path: Path):
    folder = tmp_path / "ds"
    write_image(folder / "good.png", caption="fine")
    png_declaring(folder / "bomb.png", 100_000, 100_000)  # PIL's DecompressionBombError
    png_declaring(folder / "huge.png", 10_000, 10_000)  # under PIL's limit, over ours
    os.mkfifo(folder / "fifo.png")  # opening it for reading would wait for a writer
    (folder / "folder.png").mkdir()
    write_image(folder / "zero.png")
    (folder / "zero.txt").symlink_to("/dev/zero")  # an endless caption
    write_image(folder / "link.png")
    (folder / "link.txt").symlink_to(tmp_path / "outside.txt")
    (tmp_path / "outside.txt").write_text("a linked caption")
    write_image(folder / "long.png")
    (folder / "long.txt").write_bytes(b"x" * (MAX_CAPTION_BYTES + 1))
    # A child process: before the fix, the FIFO blocked the scan forever (the limit here
    # only turns such a hang into a failure; a working scan takes seconds).
    done = subprocess.run([sys.executable, "-c", SCAN_IN_A_CHILD, str(folder)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["items"] == [["good.png", "fine"], ["link.png", "a linked caption"],
                              ["long.png", ""], ["zero.png", ""]]
    reports = "\n".join(found["reports"])
    assert f"{folder / 'bomb.png'}: unreadable image, skipped (DecompressionBombError)" \
        in reports
    assert f"{folder / 'huge.png'}: skipped (10000x10000 pixels, more than the " in reports
    assert f"{folder / 'fifo.png'}: skipped (not a regular file" in reports
    assert f"{folder / 'folder.png'}: skipped (not a regular file" in reports
    assert f"{folder / 'zero.txt'}: unreadable caption (not a regular file" in reports
    assert f"{folder / 'long.txt'}: unreadable caption ({MAX_CAPTION_BYTES + 1} bytes" \
        in reports
    assert len(found["reports"]) == 6 and "Traceback" not in done.stderr


def test_a_crop_plan_gives_that_box_of_the_image_and_its_mask(tmp_path: Path):
    import numpy as np

    from aitk.data.buckets import ResizeCrop
    from aitk.data.dataset import Item, to_bucket
    from aitk.data.masks import MaskRule, mask_pixels

    rgb = np.random.default_rng(0).integers(0, 256, (30, 50, 3)).astype(np.uint8)
    alpha = rgb[:, :, :1]  # the mask is the red channel, so the two must line up
    path = tmp_path / "a.png"
    Image.fromarray(np.concatenate([rgb, alpha], axis=2), "RGBA").save(path)
    plan = ResizeCrop(50, 30, 9, 5, 32, 16)  # no resize: a plain box at (9, 5)
    with Image.open(path) as img:
        pixels = to_bucket(img, (32, 16), plan=plan)
        item = Item(path, "", (50, 30), (32, 16))
        mask = mask_pixels(img, item, MaskRule(alpha=True), plan)
    box = rgb[5:21, 9:41].astype(np.float32)
    assert np.allclose(pixels.permute(1, 2, 0).numpy(), box / 127.5 - 1.0, atol=1e-5)
    assert np.allclose(mask[0].numpy(), box[:, :, 0] / 255.0, atol=1e-6)


def test_scale_and_square_crop_set_the_bucket_at_scan(image_folder: Path):
    items = scan_folder(image_folder, resolutions=[64], divisibility=8, scale=0.5)
    assert {i.path.name: i.bucket for i in items}["a.png"] == (32, 24)
    items = scan_folder(image_folder, resolutions=[40], divisibility=8, square_crop=True)
    assert {i.bucket for i in items} == {(40, 40)}
    assert load_pixels(items[0]).shape == (3, 40, 40)


@pytest.mark.parametrize(("keys", "message"), [
    ({"scale": 1.5}, "less than or equal to 1"),
    ({"scale": 0}, "greater than 0"),
    ({"random_crop": True, "control_path": "c"}, "turn random_crop off"),
    ({"random_scale": True, "control_path_1": "c"}, "turn random_scale off")])
def test_crop_keys_refuse_what_aitk_cannot_do(tmp_path: Path, keys: dict, message: str):
    from pydantic import ValidationError

    from aitk.config.schema import DatasetConfig

    with pytest.raises(ValidationError, match=message):
        DatasetConfig(folder_path=str(tmp_path), **keys)
