from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

import aitk.models.attention as attn
from aitk.errors import AttentionBackendError
from aitk.models.example.transformer import Attention

pytestmark = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None,
                                reason="these tests model a machine without flash-attn")


def test_flash_without_flash_attn_is_a_clear_error(model) -> None:
    with pytest.raises(AttentionBackendError, match="needs the flash-attn package"):
        model.model.set_attention_backend("flash")
    # nothing was half-switched
    assert {m.attention_backend for m in model.model.modules()
            if isinstance(m, Attention)} == {"native"}


def test_unknown_backend_is_rejected(model) -> None:
    with pytest.raises(AttentionBackendError, match="choose one of native, flash"):
        model.model.set_attention_backend("xformers")


def test_config_knob_reaches_load(make_model) -> None:
    with pytest.raises(AttentionBackendError):
        make_model(model_kwargs={"attention_backend": "flash"})


def _varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k):
    """What flash_attn_varlen_func computes, written with SDPA per sequence."""
    outs = []
    for i in range(len(cu_q) - 1):
        qi = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1)
        ki = k[cu_k[i]:cu_k[i + 1]].transpose(0, 1)
        vi = v[cu_k[i]:cu_k[i + 1]].transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(qi, ki, vi).transpose(0, 1))
    return torch.cat(outs)


def test_flash_branch_matches_native(model, inputs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag propagates to every module and the varlen plumbing (unpadding the text
    keys, cumulative offsets) gives what SDPA with a key mask gives."""
    monkeypatch.setattr(attn, "FLASH_ATTN_AVAILABLE", True)
    monkeypatch.setattr(attn, "flash_attn_varlen_func", _varlen_reference)
    latents, timesteps, embeds = inputs
    with torch.no_grad():
        native = model.get_noise_prediction(latents, timesteps, embeds)
        model.model.set_attention_backend("flash")
        assert {m.attention_backend for m in model.model.modules()
                if isinstance(m, Attention)} == {"flash"}
        flash = model.get_noise_prediction(latents, timesteps, embeds)
    # flash runs in bf16 (~1e-3 off here); dropping the key mask would be ~0.4 off
    assert torch.allclose(native, flash, atol=1e-2)
