from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aitk.errors import PromptEmbedsError, PromptEmbedsFileError
from aitk.models.prompt_embeds import AdvancedPromptEmbeds


def embeds(*lengths: int, dim: int = 3) -> AdvancedPromptEmbeds:
    items = [torch.arange(n * dim, dtype=torch.float32).reshape(n, dim) + 100 * i
             for i, n in enumerate(lengths)]
    ids = [torch.arange(n, dtype=torch.int64)[:, None] for n in lengths]  # (L, 1)
    return AdvancedPromptEmbeds(text_embeds=items, token_ids=ids,
                                frozen_dtype_keys=["token_ids"])


@pytest.mark.parametrize("shape", [(1, 4, 3), (4,), (1, 1, 4, 3)])
def test_items_must_be_2d(shape: tuple[int, ...]) -> None:
    with pytest.raises(PromptEmbedsError, match=r"2-D \(L, D\)"):
        AdvancedPromptEmbeds(text_embeds=[torch.zeros(2, 3), torch.zeros(shape)])


def test_a_batched_tensor_is_not_a_list_of_items() -> None:
    with pytest.raises(PromptEmbedsError, match="list of per-item"):
        AdvancedPromptEmbeds(text_embeds=torch.zeros(2, 4, 3))


def test_keys_must_have_the_same_item_count() -> None:
    with pytest.raises(PromptEmbedsError, match="has 1 items"):
        AdvancedPromptEmbeds(a=[torch.zeros(2, 3), torch.zeros(1, 3)], b=[torch.zeros(2, 3)])


def test_frozen_keys_must_exist() -> None:
    with pytest.raises(PromptEmbedsError, match="unknown keys"):
        AdvancedPromptEmbeds(a=[torch.zeros(2, 3)], frozen_dtype_keys=["mask"])


def test_pad_right_and_left_with_mask() -> None:
    e = embeds(2, 4)
    padded, mask = e.pad("text_embeds")
    assert padded.shape == (2, 4, 3) and mask.shape == (2, 4)
    assert torch.equal(padded[0, :2], e.text_embeds[0])
    assert torch.equal(padded[0, 2:], torch.zeros(2, 3))
    assert mask.tolist() == [[True, True, False, False], [True] * 4]

    left, lmask = e.pad("text_embeds", padding_side="left")
    assert torch.equal(left[0, 2:], e.text_embeds[0])
    assert lmask.tolist() == [[False, False, True, True], [True] * 4]

    longer, _ = e.pad("text_embeds", max_length=6)
    assert longer.shape == (2, 6, 3)


def test_pad_rejects_mixed_widths() -> None:
    e = AdvancedPromptEmbeds(a=[torch.zeros(2, 3), torch.zeros(2, 5)])
    with pytest.raises(PromptEmbedsError, match="different widths"):
        e.pad("a")


def test_to_does_not_cast_frozen_keys() -> None:
    moved = embeds(2, 3).to("cpu", torch.float16)
    assert all(t.dtype == torch.float16 for t in moved.text_embeds)
    assert all(t.dtype == torch.int64 for t in moved.token_ids)


def test_cat_select_concat_expand() -> None:
    a, b = embeds(2), embeds(5)
    both = AdvancedPromptEmbeds.cat([a, b])
    assert len(both) == 2
    assert [t.shape[0] for t in both.text_embeds] == [2, 5]
    assert both.frozen_dtype_keys == ("token_ids",)
    assert torch.equal(both.select([1]).text_embeds[0], b.text_embeds[0])
    cfg = a.concat(b)
    assert [t.shape[0] for t in cfg.token_ids] == [2, 5]
    assert len(a.expand_to_batch(3)) == 3
    assert both.expand_to_batch(2) is both
    with pytest.raises(PromptEmbedsError, match="cannot expand 2"):
        both.expand_to_batch(3)
    with pytest.raises(PromptEmbedsError, match="out of range"):
        both.select([2])
    with pytest.raises(PromptEmbedsError, match="keys differ"):
        AdvancedPromptEmbeds.cat([a, AdvancedPromptEmbeds(other=[torch.zeros(1, 3)])])


def test_save_load_round_trip(tmp_path: Path) -> None:
    e = AdvancedPromptEmbeds.cat([embeds(2), embeds(4)]).to(dtype=torch.bfloat16)
    path = tmp_path / "cache" / "e.safetensors"
    e.save(path)
    back = AdvancedPromptEmbeds.load(path)
    assert back.keys() == e.keys()
    assert back.frozen_dtype_keys == ("token_ids",)
    for key in e.keys():
        for x, y in zip(e[key], back[key], strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y)
    assert not list(path.parent.glob("*.tmp"))  # atomic writer left no temp file


def test_save_accepts_views_of_one_batch_tensor(tmp_path: Path) -> None:
    batch = torch.randn(2, 5, 3)  # items that share storage, as sliced from a TE output
    e = AdvancedPromptEmbeds(text_embeds=[batch[0, :2], batch[1, :5]])
    e.save(tmp_path / "e.safetensors")
    assert torch.equal(AdvancedPromptEmbeds.load(tmp_path / "e.safetensors")
                       .text_embeds[0], batch[0, :2])


def test_damaged_or_foreign_file_raises_file_error(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "e.safetensors"
    embeds(3).save(path)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(PromptEmbedsFileError):
        AdvancedPromptEmbeds.load(path)
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(PromptEmbedsFileError, match="not a prompt-embeds file"):
        AdvancedPromptEmbeds.load(tmp_path / "other.safetensors")
