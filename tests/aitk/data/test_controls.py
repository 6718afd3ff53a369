"""Control images for edit models (aitk.data.controls): pairing by file stem, several
folders, a wrong-size control resized, a missing control skipped once, batches carrying
control tensors, and text-embed cache keys that include the control image."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from aitk.audit.preflight import preflight
from aitk.config.loading import parse_job
from aitk.config.schema import DatasetConfig
from aitk.data import controls
from aitk.data.batches import BatchSource
from aitk.data.dataset import load_pixels, scan_folder
from aitk.errors import DatasetError
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.run.sampling import image_configs
from tests.aitk.aitk_testing import job_config, write_image


@pytest.fixture
def pairs(tmp_path: Path) -> tuple[Path, Path, Path]:
    data, ctrl, ctrl2 = tmp_path / "data", tmp_path / "ctrl", tmp_path / "ctrl2"
    write_image(data / "a.png", (64, 64), (200, 30, 30), "make a red")
    write_image(data / "b.jpg", (64, 64), (30, 200, 30), "make b green")
    write_image(ctrl / "a.jpg", (64, 64), (10, 10, 200))  # any image type pairs by stem
    write_image(ctrl / "b.png", (64, 64), (10, 200, 10))
    write_image(ctrl2 / "a.webp", (32, 32), (90, 90, 90))
    write_image(ctrl2 / "b.png", (32, 32), (120, 120, 120))
    return data, ctrl, ctrl2


def scanned(data: Path) -> list:
    return scan_folder(data, resolutions=[64], divisibility=32, report=lambda m: None)


def test_controls_pair_by_file_stem(pairs):
    data, ctrl, _ = pairs
    items = controls.pair_controls(scanned(data), [ctrl])
    assert {i.path.name: [c.name for c in i.controls] for i in items} == {
        "a.png": ["a.jpg"], "b.jpg": ["b.png"]}


def test_control_folders_come_in_upstream_order():
    ds = DatasetConfig(folder_path="d", control_path=["c0", "c1"], control_path_2="c2")
    assert ds.control_paths == ["c0", "c1", "c2"]
    assert DatasetConfig(folder_path="d", control_path="c").control_paths == ["c"]
    assert DatasetConfig(folder_path="d").control_paths == []


def test_a_list_of_folders_gives_one_tensor_per_folder(pairs):
    data, ctrl, ctrl2 = pairs
    items = controls.pair_controls(scanned(data), [ctrl, ctrl2])
    batch = controls.control_batch(items)
    assert batch is not None and len(batch) == 2
    assert all(t.shape == (2, 3, 64, 64) for t in batch)
    assert 0.0 <= min(t.min().item() for t in batch) and max(t.max().item() for t in batch) <= 1
    # folder order: the first folder's blue, the second's grey
    assert batch[0][0, 2].mean() > 0.7 and abs(batch[1][0, 0].mean() - 90 / 255) < 0.02


def test_a_wrong_size_control_is_resized_and_centre_cropped(tmp_path: Path):
    data, ctrl = tmp_path / "data", tmp_path / "ctrl"
    write_image(data / "a.png", (64, 32), (200, 30, 30), "x")
    wide = Image.new("RGB", (300, 100), (0, 0, 255))  # 3:1, the bucket is 2:1
    wide.paste((255, 0, 0), (0, 0, 30, 100))  # red only in the strip a crop removes
    ctrl.mkdir()
    wide.save(ctrl / "a.png")
    items = controls.pair_controls(scanned(data), [ctrl])
    pixels = controls.load_control(items[0].controls[0], items[0].bucket)
    assert pixels.shape == (3, 32, 64)  # (H, W) of the bucket
    assert pixels[0].max() < 0.05 and pixels[2].min() > 0.95  # cropped to the blue middle
    small = Image.new("RGB", (8, 8), (0, 255, 0))
    small.save(ctrl / "a.png")  # smaller than the image: scaled up, never refused
    up = controls.load_control(items[0].controls[0], (64, 32))
    assert up.shape == (3, 32, 64) and up[1].min() > 0.95


def test_a_same_size_control_is_pixel_aligned_with_its_image(tmp_path: Path):
    data, ctrl = tmp_path / "data", tmp_path / "ctrl"
    gradient = Image.linear_gradient("L").resize((96, 64)).convert("RGB")
    data.mkdir()
    ctrl.mkdir()
    gradient.save(data / "a.png")
    gradient.save(ctrl / "a.png")
    item = controls.pair_controls(scanned(data), [ctrl])[0]
    assert item.bucket != item.size  # resized and cropped
    image = (load_pixels(item) + 1) / 2
    assert torch.allclose(controls.load_control(item.controls[0], item.bucket), image,
                          atol=1e-6)


def test_an_image_without_its_control_is_reported_once_and_skipped(pairs):
    data, ctrl, _ = pairs
    (ctrl / "b.png").unlink()
    said: list[str] = []
    items = controls.pair_controls(scanned(data) * 2, [ctrl], said.append)
    assert [i.path.name for i in items] == ["a.png", "a.png"]
    assert len(set(said)) == 1 and "b.jpg: no control image b.* in" in said[0]
    (ctrl / "a.jpg").write_bytes(b"not an image")
    said.clear()
    with pytest.raises(DatasetError, match="no image of .* has a readable control"):
        controls.pair_controls(scanned(data), [ctrl], said.append)
    assert any("unreadable control image" in s for s in said)
    with pytest.raises(DatasetError, match="control folder .* does not exist"):
        controls.pair_controls(scanned(data), [ctrl.parent / "nope"])


def test_datasets_with_and_without_controls_do_not_mix(pairs):
    data, ctrl, _ = pairs
    with pytest.raises(DatasetError, match="same number of control folders"):
        controls.check_same_count(controls.pair_controls(scanned(data), [ctrl])
                                  + scanned(data))


def embeds_of(captions: list[str]) -> AdvancedPromptEmbeds:
    return AdvancedPromptEmbeds(text_embeds=[torch.full((2, 3), float(len(c)))
                                             for c in captions])


def test_batches_carry_control_tensors_and_control_aware_embeds(pairs):
    data, ctrl, ctrl2 = pairs
    items = controls.pair_controls(scanned(data), [ctrl, ctrl2])
    seen = []

    def control_embeds(captions, batch_items, tensors):
        seen.append((list(captions), [i.path.name for i in batch_items],
                     [t.shape for t in tensors]))
        return embeds_of(captions)

    source = BatchSource(items, 2, 0, None, lambda x: x[:, :1], embeds_of, control_embeds)
    batch = source.next()
    assert batch.control_tensor_list is not None and len(batch.control_tensor_list) == 2
    assert batch.control_tensor is batch.control_tensor_list[0]
    assert batch.control_tensor.shape == (2, 3, 64, 64)
    assert seen and seen[0][2] == [(2, 3, 64, 64)] * 2
    plain = BatchSource(scanned(data), 2, 0, None, lambda x: x[:, :1], embeds_of).next()
    assert plain.control_tensor is None and plain.control_tensor_list is None


def test_the_text_embed_cache_key_includes_the_control_image(pairs, tmp_path: Path):
    data, ctrl, _ = pairs
    items = controls.pair_controls(scanned(data), [ctrl])
    calls: list[float] = []

    def encode(captions, images):
        calls.append(images[0].mean().item())
        return AdvancedPromptEmbeds(text_embeds=[images[0][0, :, 0, :2].T.contiguous()])

    folder = tmp_path / "cache"
    cache = controls.ControlTextEmbedCache(encode, "model", "1", folder)
    same_caption = [("edit", items[0]), ("edit", items[1])]
    cache.fill(same_caption)
    assert cache.computed == 2  # one caption, two controls: two entries
    assert cache.key("edit", items[0]) != cache.key("edit", items[1])
    first = cache.get(["edit"], [items[0]])
    again = controls.ControlTextEmbedCache(encode, "model", "1", folder)
    again.fill(same_caption)
    assert again.computed == 0  # read back from disk
    assert torch.equal(again.get(["edit"], [items[0]]).text_embeds[0], first.text_embeds[0])
    write_image(items[0].controls[0], (64, 64), (250, 250, 0))  # the control is edited
    edited = controls.ControlTextEmbedCache(encode, "model", "1", folder)
    edited.fill(same_caption)
    assert edited.computed == 1  # never the stale entry
    assert not torch.equal(edited.get(["edit"], [items[0]]).text_embeds[0],
                           first.text_embeds[0])


def test_caption_dropout_embeds_the_empty_caption_with_each_control(pairs):
    data, ctrl, _ = pairs
    items = [i.__class__(**{**i.__dict__, "caption_dropout_rate": 0.5})
             for i in controls.pair_controls(scanned(data), [ctrl])]
    assert ("", items[0]) in controls.caption_pairs(items)


def test_upstream_control_keys_are_read_not_warned(pairs, tmp_path: Path):
    data, ctrl, ctrl2 = pairs
    cfg = job_config("e", tmp_path / "out", tmp_path / "model",
                     datasets=[{"folder_path": str(data), "control_path": [str(ctrl)],
                                "control_path_1": str(ctrl2)}],
                     sample={"samples": [{"prompt": "edit", "ctrl_img": str(ctrl / "a.jpg"),
                                          "ctrl_img_2": str(ctrl2 / "b.png")}]})
    loaded = parse_job(cfg, "job.yml", env={}, check_arch=lambda a: None)
    assert not [w for w in loaded.warnings if "ctrl" in w or "control" in w]
    proc = loaded.job.config.process[0]
    assert proc.datasets[0].control_paths == [str(ctrl), str(ctrl2)]
    [sample] = image_configs(proc.sample, None)
    assert sample.ctrl_img == str(ctrl / "a.jpg")
    assert sample.ctrl_imgs == [str(ctrl / "a.jpg"), str(ctrl2 / "b.png")]


def test_preflight_reports_a_missing_ctrl_img_and_a_missing_control_folder(pairs,
                                                                          tmp_path: Path):
    data, ctrl, _ = pairs
    (tmp_path / "model").mkdir()
    cfg = job_config("e", tmp_path / "out", tmp_path / "model",
                     datasets=[{"folder_path": str(data), "control_path": str(ctrl)}],
                     sample={"samples": [{"prompt": "edit", "ctrl_img": str(ctrl / "a.jpg")},
                                         {"prompt": "x", "ctrl_img": str(tmp_path / "no.png")}]})
    loaded = parse_job(cfg, "job.yml", env={}, check_arch=lambda a: None)
    errors = [f for f in preflight(loaded) if f.level.name == "ERROR"]
    assert [f.path for f in errors] == ["config.process[0].sample.samples[1].ctrl_img"]
    cfg["config"]["process"][0]["datasets"][0]["control_path"] = str(tmp_path / "none")
    loaded = parse_job(cfg, "job.yml", env={}, check_arch=lambda a: None)
    errors = [f for f in preflight(loaded) if f.level.name == "ERROR"]
    assert any("control folder does not exist" in f.message for f in errors)
