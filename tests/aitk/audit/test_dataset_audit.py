"""`aitk audit dataset`: a fixture folder with one file per finding, each reported by
level, place and kind; the bundled example dataset is clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aitk.audit.dataset import DatasetOptions, audit_dataset
from aitk.cli.audit import main as audit_main
from aitk.findings import Level
from tests.aitk.aitk_testing import REPO, write_image


def _save(path: Path, img: Image.Image, caption: str | None = "p1xel a thing", **kw) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)


@pytest.fixture
def broken(tmp_path: Path) -> tuple[Path, Path]:
    d, ctrl = tmp_path / "data", tmp_path / "ctrl"
    rgb = Image.new("RGB", (128, 128), (10, 20, 30))
    _save(d / "good.png", rgb)
    write_image(ctrl / "good.png", (128, 128))
    _save(d / "dup.png", rgb)  # same bytes as good.png
    full = d / "cut.png"
    _save(full, Image.fromarray(np.random.default_rng(0).integers(0, 255, (96, 96, 3),
                                                                  dtype=np.uint8)))
    full.write_bytes(full.read_bytes()[:400])  # truncated
    (d / "garbage.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (d / "garbage.txt").write_text("caption of an unreadable file")
    _save(d / "nocap.png", Image.new("RGB", (128, 128), (1, 2, 3)), caption=None)
    _save(d / "emptycap.png", Image.new("RGB", (128, 128), (4, 5, 6)), caption="  ")
    (d / "orphan.txt").write_text("no image for this caption")
    _save(d / "long.png", Image.new("RGB", (128, 128), (7, 8, 9)),
          caption="p1xel " + "word " * 250)
    _save(d / "notrigger.png", Image.new("RGB", (128, 128), (9, 9, 9)), caption="a dog")
    _save(d / "small.png", Image.new("RGB", (64, 64), (11, 12, 13)))
    _save(d / "tiny.png", Image.new("RGB", (8, 8), (11, 12, 14)))
    _save(d / "wide.png", Image.new("RGB", (600, 100), (15, 16, 17)))
    exif = Image.Exif()
    exif[0x0112] = 6
    _save(d / "rotated.jpg", Image.new("RGB", (160, 96), (18, 19, 20)), exif=exif)
    _save(d / "cmyk.jpg", Image.new("CMYK", (128, 128), (0, 50, 100, 0)))
    _save(d / "deep.png", Image.new("I;16", (128, 128), 30000))
    _save(d / "alpha.png", Image.new("RGBA", (128, 128), (1, 2, 3, 100)))
    write_image(ctrl / "extra.png", (128, 128))
    return d, ctrl


def _findings(report):
    return {(f.level, f.code, f.path) for f in report.findings}


def test_every_finding_is_reported_by_level_and_file(broken):
    d, ctrl = broken
    report = audit_dataset(DatasetOptions(d, controls=[ctrl], resolutions=[128],
                                          trigger="p1xel"))
    found = _findings(report)
    E, W, I = Level.ERROR, Level.WARNING, Level.INFO  # noqa: E741
    for expected in [
        (E, "truncated", "cut.png"), (E, "unreadable", "garbage.jpg"),
        (W, "missing_caption", "nocap.png"), (W, "empty_caption", "emptycap.txt"),
        (W, "orphan_caption", "orphan.txt"), (I, "long_caption", "long.png"),
        (I, "trigger_prepended", "notrigger.png"), (W, "small_image", "small.png"),
        (E, "too_small", "tiny.png"), (W, "extreme_aspect", "wide.png"),
        (W, "duplicate", "good.png"), (I, "exif_rotated", "rotated.jpg"),
        (W, "cmyk", "cmyk.jpg"), (W, "high_bit", "deep.png"), (W, "alpha", "alpha.png"),
        (E, "missing_control", "small.png"), (W, "orphan_control", str(ctrl / "extra.png")),
    ]:
        assert expected in found, expected
    assert not any(code == "missing_control" and path == "good.png"
                   for _, code, path in found)
    assert report.exit_code == 1
    s = report.summary
    assert s["files"]["caption"] == 15 and s["files"]["image png"] == 12
    assert s["captions_with_trigger"] >= 1 and s["divisibility"] == 16
    assert s["buckets"]["128"]["128x128"] >= 1


def test_rotation_swaps_the_size_used_for_buckets(broken):
    d, _ = broken
    report = audit_dataset(DatasetOptions(d, resolutions=[512]))
    msg = next(f.message for f in report.findings if f.code == "exif_rotated")
    assert "96x160" in msg


def test_decompression_bombs_are_refused(tmp_path, monkeypatch):
    _save(tmp_path / "big.png", Image.new("RGB", (200, 200)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    report = audit_dataset(DatasetOptions(tmp_path))
    assert (Level.ERROR, "too_large", "big.png") in _findings(report)


def test_arch_sets_the_divisibility(broken):
    d, _ = broken
    report = audit_dataset(DatasetOptions(d, resolutions=[128], arch="sdxl"))
    assert report.summary["divisibility"] == 32  # VAE 8 x the UNet's two downsamplings


def test_buckets_follow_scale_and_square_crop(tmp_path):
    _save(tmp_path / "a.png", Image.new("RGB", (256, 128)))
    buckets = lambda **kw: audit_dataset(  # noqa: E731
        DatasetOptions(tmp_path, resolutions=[128], **kw)).summary["buckets"]
    assert buckets() == {"128": {"176x80": 1}}
    assert buckets(scale=0.5) == {"128": {"128x64": 1}}
    assert buckets(square_crop=True) == {"128": {"128x128": 1}}


def test_the_bundled_example_dataset_is_clean(capsys):
    code = audit_main(["dataset", str(REPO / "datasets" / "example"), "--resolution", "64",
                       "--resolution", "96", "--arch", "example", "--trigger", "p1xel"])
    out = capsys.readouterr().out
    assert code == 0 and out.strip().splitlines()[-1].startswith("OK: 0 errors, 0 warnings")


def test_json_has_every_finding_and_exit_1_on_an_error(broken, capsys):
    d, ctrl = broken
    code = audit_main(["dataset", str(d), "--control", str(ctrl), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False and doc["audit"] == "dataset"
    assert doc["counts"]["error"] == sum(f["level"] == "error" for f in doc["findings"])
    assert {"level", "path", "message", "fix", "code"} <= set(doc["findings"][0])


def test_text_summary_is_short_and_points_to_json(tmp_path, capsys):
    for i in range(6):
        write_image(tmp_path / f"{i}.png", (64, 64))  # no captions
    assert audit_main(["dataset", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("no caption file") == 3 and "and 3 more like this" in out


def test_a_missing_folder_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "aitk", "audit", "dataset", "/nonexistent"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr
