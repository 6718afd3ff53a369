"""Loss masks (aitk.data.masks): paired by stem, resized and cropped like their image,
alpha, invert and min value, missing ones reported once, attached to batches."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from aitk.data.batch import DataBatch
from aitk.data.dataset import scan_folder
from aitk.data.masks import MaskRule, Masks, latent_weights
from tests.aitk.aitk_testing import write_image


def half_mask(path: Path, size: tuple[int, int]) -> None:
    """White on the right half, black on the left."""
    w, h = size
    arr = np.zeros((h, w), np.uint8)
    arr[:, w // 2:] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def test_a_mask_is_resized_and_cropped_like_its_image(tmp_path: Path):
    write_image(tmp_path / "imgs" / "a.png", (96, 64), caption="a")
    half_mask(tmp_path / "masks" / "a.png", (48, 32))  # half the image's size
    items = scan_folder(tmp_path / "imgs", resolutions=[32], divisibility=16)
    reports: list[str] = []
    masks = Masks([MaskRule(tmp_path / "masks")], items, reports.append)
    mask = masks.load(items[0])
    w, h = items[0].bucket
    assert mask.shape == (1, h, w) and not reports
    # black left half, white right half, after the image's own resize and centre crop
    assert mask[0, :, : w // 2 - 1].max() < 0.05 and mask[0, :, w // 2 + 1:].min() > 0.95


def test_invert_and_min_value(tmp_path: Path):
    write_image(tmp_path / "imgs" / "a.png", (32, 32), caption="a")
    half_mask(tmp_path / "masks" / "a.png", (32, 32))
    items = scan_folder(tmp_path / "imgs", resolutions=[32], divisibility=16)
    rule = MaskRule.of(SimpleNamespace(mask_path=str(tmp_path / "masks"), alpha_mask=False,
                                       invert_mask=True, mask_min_value=0.2))
    mask = Masks([rule], items, print).load(items[0])
    assert torch.allclose(mask[0, :, :16], torch.ones(32, 16))  # was black, inverted
    assert torch.allclose(mask[0, :, 16:], torch.full((32, 16), 0.2))  # lifted to 0.2


def test_alpha_mask_reads_the_images_alpha_channel(tmp_path: Path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    arr = np.full((32, 32, 4), 200, np.uint8)
    arr[:, :, 3] = 255
    arr[:, :16, 3] = 0
    Image.fromarray(arr, "RGBA").save(folder / "a.png")
    write_image(folder / "b.png", (32, 32), caption="no alpha")
    items = scan_folder(folder, resolutions=[32], divisibility=16, report=lambda m: None)
    reports: list[str] = []
    masks = Masks([MaskRule.of(SimpleNamespace(mask_path=None, alpha_mask=True))], items,
                  reports.append)
    by_name = {i.path.name: masks.load(i) for i in items}
    assert by_name["a.png"][0, :, :16].max() == 0 and by_name["a.png"][0, :, 16:].min() == 1
    assert torch.equal(by_name["b.png"], torch.ones(1, 32, 32))
    assert reports == [f"{folder / 'b.png'}: alpha_mask is set but the image has no alpha "
                       "channel; trained unmasked"]


def test_missing_and_unreadable_masks_are_reported_once_and_train_unmasked(tmp_path: Path):
    write_image(tmp_path / "imgs" / "a.png", (32, 32), caption="a")
    write_image(tmp_path / "imgs" / "b.png", (32, 32), caption="b")
    (tmp_path / "masks").mkdir()
    (tmp_path / "masks" / "b.png").write_bytes(b"not a png")
    items = scan_folder(tmp_path / "imgs", resolutions=[32], divisibility=16,
                        num_repeats=3)
    reports: list[str] = []
    masks = Masks([MaskRule(tmp_path / "masks")], items, reports.append)
    assert len(reports) == 2  # once per image, whatever the repeats
    assert "no mask a.*" in reports[0] and "unreadable mask" in reports[1]
    batch = masks.attach(DataBatch(captions=["a", "b"], items=items[:1] + items[-1:]))
    assert torch.equal(batch.mask, torch.ones(2, 1, 32, 32))


def test_datasets_without_masks_leave_batches_unmasked(tmp_path: Path):
    write_image(tmp_path / "imgs" / "a.png", (32, 32), caption="a")
    items = scan_folder(tmp_path / "imgs", resolutions=[32], divisibility=16)
    masks = Masks([None], items, print)
    assert not masks.active
    assert masks.attach(DataBatch(captions=["a"], items=items)).mask is None


def test_latent_weights_average_the_pixels_of_each_cell():
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., :, 6:] = 1.0  # the last two pixel columns
    cells = latent_weights(mask, torch.zeros(1, 4, 2, 2))
    assert cells.shape == (1, 1, 2, 2)
    assert cells[0, 0, :, 0].tolist() == [0.0, 0.0] and cells[0, 0, :, 1].tolist() == [0.5, 0.5]
    video = latent_weights(mask, torch.zeros(1, 4, 3, 2, 2))
    assert video.shape == (1, 1, 1, 2, 2)  # the same mask on every frame


def test_a_mirrored_copy_gets_the_mirrored_mask(tmp_path: Path):
    """flip_x / flip_y copies (aitk.run.assembly.mirrored) flip their mask with their
    pixels, so the loss still looks where the subject is."""
    import dataclasses

    write_image(tmp_path / "imgs" / "a.png", (48, 32), caption="a")
    half_mask(tmp_path / "masks" / "a.png", (48, 32))  # white on the right
    [item] = scan_folder(tmp_path / "imgs", resolutions=[32], divisibility=16)
    masks = Masks([MaskRule(tmp_path / "masks")], [item], print)
    plain = masks.load(item)
    assert torch.equal(masks.load(dataclasses.replace(item, flip_x=True)),
                       plain.flip(-1))
    assert torch.equal(masks.load(dataclasses.replace(item, flip_y=True)), plain.flip(-2))
    assert not torch.equal(plain, plain.flip(-1))
