"""Cache keying: content + processing + model identity + space version; corrupt entries
are recomputed; cached text embeddings survive unloading the text encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aitk.data.cache import LatentCache, TextEmbedCache
from aitk.data.dataset import scan_folder
from tests.aitk.aitk_testing import write_image


def latent_cache(model, folder: Path, identity="tiny-model-v1", space="1", reports=None):
    return LatentCache(model.encode_images, identity, space, folder,
                       report=(reports.append if reports is not None else print))


def items_of(folder: Path):
    return scan_folder(folder, resolutions=[32], divisibility=8)


def test_second_fill_reads_the_disk_cache(tiny_model, image_folder: Path, tmp_path: Path):
    first = latent_cache(tiny_model, tmp_path / "c")
    first.fill(items_of(image_folder))
    assert first.computed == 3
    second = latent_cache(tiny_model, tmp_path / "c")
    second.fill(items_of(image_folder))
    assert second.computed == 0
    items = items_of(image_folder)
    assert torch.equal(first.get(items[:1]), second.get(items[:1]))


def test_edited_image_is_recomputed(tiny_model, image_folder: Path, tmp_path: Path):
    latent_cache(tiny_model, tmp_path / "c").fill(items_of(image_folder))
    write_image(image_folder / "a.png", (64, 48), (0, 0, 0))  # same name and size
    again = latent_cache(tiny_model, tmp_path / "c")
    again.fill(items_of(image_folder))
    assert again.computed == 1
    item = next(i for i in items_of(image_folder) if i.path.name == "a.png")
    assert again.get([item]).mean() < -0.9  # the new, black image


@pytest.mark.parametrize("change", [{"identity": "another-model"}, {"space": "2"}])
def test_other_model_or_space_version_is_recomputed(tiny_model, image_folder: Path,
                                                    tmp_path: Path, change):
    latent_cache(tiny_model, tmp_path / "c").fill(items_of(image_folder))
    other = latent_cache(tiny_model, tmp_path / "c", **change)
    other.fill(items_of(image_folder))
    assert other.computed == 3


def test_other_bucket_is_another_entry(tiny_model, image_folder: Path, tmp_path: Path):
    latent_cache(tiny_model, tmp_path / "c").fill(items_of(image_folder))
    bigger = latent_cache(tiny_model, tmp_path / "c")
    bigger.fill(scan_folder(image_folder, resolutions=[48], divisibility=8))
    assert bigger.computed == 3


def test_corrupt_entry_is_reported_and_recomputed(tiny_model, image_folder: Path,
                                                  tmp_path: Path):
    latent_cache(tiny_model, tmp_path / "c").fill(items_of(image_folder))
    entry = next((tmp_path / "c").rglob("*.safetensors"))
    entry.write_bytes(entry.read_bytes()[:20])
    reports: list[str] = []
    again = latent_cache(tiny_model, tmp_path / "c", reports=reports)
    again.fill(items_of(image_folder))
    assert again.computed == 1
    assert len(reports) == 1 and "unreadable" in reports[0] and entry.name in reports[0]
    assert latent_cache(tiny_model, tmp_path / "c").computed == 0


def test_repeats_share_one_entry(tiny_model, image_folder: Path, tmp_path: Path):
    cache = latent_cache(tiny_model, tmp_path / "c")
    cache.fill(scan_folder(image_folder, resolutions=[32], divisibility=8, num_repeats=4))
    assert cache.computed == 3


def test_text_embeds_cache_by_caption_identity_and_version(tiny_model, tmp_path: Path):
    def make(identity="tiny-model-v1", space="1"):
        return TextEmbedCache(tiny_model.encode_prompts, identity, space, tmp_path / "t")

    first = make()
    first.fill(["a cat", "a dog", "a cat"])
    assert first.computed == 2
    expected = first.get(["a dog", "a cat"])
    tiny_model.unload_text_encoder()
    second = make()
    second.fill(["a cat", "a dog"])  # all from disk: no text encoder needed
    assert second.computed == 0
    got = second.get(["a dog", "a cat"])
    assert all(torch.equal(a, b) for a, b in zip(got["text_embeds"], expected["text_embeds"],
                                                  strict=True))
    with pytest.raises(Exception, match="unloaded"):
        make(identity="other").fill(["a cat"])
    with pytest.raises(Exception, match="unloaded"):
        make(space="2").fill(["a cat"])


def test_corrupt_text_entry_is_recomputed(tiny_model, tmp_path: Path):
    cache = TextEmbedCache(tiny_model.encode_prompts, "m", "1", tmp_path / "t")
    cache.fill(["a cat"])
    entry = next((tmp_path / "t").rglob("*.safetensors"))
    entry.write_bytes(b"garbage")
    reports: list[str] = []
    again = TextEmbedCache(tiny_model.encode_prompts, "m", "1", tmp_path / "t",
                           report=reports.append)
    again.fill(["a cat"])
    assert again.computed == 1 and len(reports) == 1


def test_many_captions_are_encoded_in_bounded_batches(tiny_model, tmp_path: Path):
    sizes: list[int] = []

    def encode(captions):
        sizes.append(len(captions))
        return tiny_model.encode_prompts(captions)

    cache = TextEmbedCache(encode, "m", "1", None)
    cache.fill([f"caption {i}" for i in range(40)])
    assert sizes == [16, 16, 8] and cache.computed == 40
    assert len(cache.get(["caption 3", "caption 39"])) == 2
