"""The one alpha folding the archs without `.alpha` keys share (sd3, hidream, ltx2,
krea2): the delta B @ A * alpha / rank survives fold -> unfold, in the file's dtype."""

from __future__ import annotations

import pytest
import torch

from aitk.adapters.alpha_folding import fold_alphas, unfolded_alphas
from aitk.models.krea2 import lora_keys as krea2_keys
from aitk.models.ltx2.lora_keys import from_ltx2_keys, to_ltx2_keys


def lora(rank: int = 4, alpha: float = 2.0, dtype: torch.dtype = torch.float32
         ) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"m.lora_A.weight": torch.randn(rank, 6, generator=g).to(dtype),
            "m.lora_B.weight": torch.randn(5, rank, generator=g).to(dtype),
            "m.alpha": torch.tensor(alpha)}


def delta(sd: dict[str, torch.Tensor]) -> torch.Tensor:
    down, up = sd["m.lora_A.weight"].float(), sd["m.lora_B.weight"].float()
    return up @ down * (float(sd["m.alpha"]) / down.shape[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_keeps_the_delta_and_drops_the_alpha(dtype: torch.dtype) -> None:
    sd = lora(dtype=dtype)
    folded = fold_alphas(sd)
    assert "m.alpha" not in folded and folded["m.lora_B.weight"].dtype == dtype
    back = unfolded_alphas(folded)
    assert float(back["m.alpha"]) == 4.0  # no alpha in the file: scale 1, alpha = rank
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(delta(back), delta(sd), atol=tol)


def test_an_alpha_of_another_adapter_kind_stays() -> None:
    lokr = {"m.lokr_w1": torch.ones(2, 2), "m.alpha": torch.tensor(2.0)}
    assert fold_alphas(lokr).keys() == lokr.keys()
    assert unfolded_alphas(lokr).keys() == lokr.keys()


def test_a_file_alpha_is_kept_on_reading() -> None:
    sd = lora(alpha=8.0)
    assert float(unfolded_alphas(sd)["m.alpha"]) == 8.0


def test_ltx2_and_krea2_layouts_round_trip_through_the_shared_folding() -> None:
    sd = lora()
    for module in ("transformer_blocks.0.attn1.to_q",):
        ltx = {k.replace("m.", module + ".", 1): v for k, v in sd.items()}
        back = from_ltx2_keys(to_ltx2_keys(ltx))
        assert not any(k.endswith(".alpha") for k in to_ltx2_keys(ltx))
        assert torch.allclose(delta({k.replace(module + ".", "m.", 1): v
                                     for k, v in back.items()}), delta(sd))
    krea = {k.replace("m.", "transformer_blocks.0.attn.to_q.", 1): v for k, v in sd.items()}
    written = krea2_keys.to_file(krea)
    assert set(written) == {"diffusion_model.blocks.0.attn.wq.lora_A.weight",
                            "diffusion_model.blocks.0.attn.wq.lora_B.weight"}
    back = krea2_keys.from_file(written)
    assert torch.allclose(delta({k.replace("transformer_blocks.0.attn.to_q.", "m.", 1): v
                                 for k, v in back.items()}), delta(sd))
