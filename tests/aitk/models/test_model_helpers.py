"""The helpers several archs share instead of each writing its own: BaseModel's quantize
switches, sample-size check and prompt-token limit, and aitk.models.kl_latents (the
latents of a diffusers AutoencoderKL)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import aitk.models.quantize
from aitk.models import kl_latents
from aitk.models.base import BaseModel, GenerateImageConfig


def model(**overrides: Any) -> BaseModel:
    base = dict(arch="demo", name_or_path="unused", quantize=False, quantize_te=False,
                qtype="qfloat8", qtype_te="qfloat8", model_kwargs={})
    return BaseModel(SimpleNamespace(**{**base, **overrides}))


# ---- quantization as the config asks ------------------------------------------------------
@pytest.fixture
def quantized(monkeypatch) -> list[tuple[Any, str, tuple[str, ...]]]:
    calls: list[tuple[Any, str, tuple[str, ...]]] = []
    monkeypatch.setattr(aitk.models.quantize, "quantize_linear_layers",
                        lambda module, qtype, exclude=(): calls.append(
                            (module, qtype, tuple(exclude))))
    return calls


def test_quantize_helpers_follow_quantize_and_quantize_te(quantized) -> None:
    denoiser, text = object(), object()
    off = model()
    off.quantize_transformer(denoiser, exclude=("proj_out",))
    off.quantize_text_encoder(text)
    assert quantized == []
    on = model(quantize=True, qtype="qint8", quantize_te=True, qtype_te="qint4")
    on.quantize_transformer(denoiser, exclude=("proj_out",))
    on.quantize_text_encoder(text, exclude=("lm_head",))
    assert quantized == [(denoiser, "qint8", ("proj_out",)), (text, "qint4", ("lm_head",))]


def test_quantize_helpers_default_to_off_and_qfloat8(quantized) -> None:
    bare = BaseModel(SimpleNamespace(arch="demo", name_or_path="unused"))
    bare.quantize_transformer(object())
    assert quantized == []
    some = BaseModel(SimpleNamespace(arch="demo", name_or_path="unused", quantize=True,
                                     quantize_te=True))
    text = object()
    some.quantize_text_encoder(text)
    assert quantized == [(text, "qfloat8", ())]


# ---- previews -----------------------------------------------------------------------------
def test_check_sample_size_refuses_sides_off_the_bucket_grid() -> None:
    m = model()  # BaseModel's divisibility: 16
    m.check_sample_size(GenerateImageConfig(prompt="", width=32, height=48), "demo")
    with pytest.raises(ValueError, match=r"^sample size 40x32 is not a multiple of 16 "
                       r"\(demo: VAE 8 x packing 2\)$"):
        m.check_sample_size(GenerateImageConfig(prompt="", width=40, height=32),
                            "demo: VAE 8 x packing 2")


# ---- prompt length ------------------------------------------------------------------------
def test_prompt_token_limit_is_the_kwarg_else_the_tokenizer_limit_capped() -> None:
    tok = SimpleNamespace(model_max_length=77)
    assert model().prompt_token_limit(tok, 512) == 77
    assert model(model_kwargs={"max_sequence_length": "300"}).prompt_token_limit(tok, 512) == 300
    # transformers' "no limit known" value, and a tokenizer without the attribute.
    assert model().prompt_token_limit(SimpleNamespace(model_max_length=int(1e30)), 512) == 512
    assert model().prompt_token_limit(object(), 256) == 256
    assert model(model_kwargs=None).prompt_token_limit(tok, 512) == 77


# ---- AutoencoderKL latents ----------------------------------------------------------------
class FakeKL:
    """Encodes to the pixels themselves (mean) and decodes to the latents."""

    def __init__(self, shift: float | None, scale: float) -> None:
        self.config = SimpleNamespace(shift_factor=shift, scaling_factor=scale)
        self.seen: list[tuple[torch.dtype, bool]] = []

    def encode(self, x: torch.Tensor) -> Any:
        self.seen.append((x.dtype, torch.is_grad_enabled()))
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=x.clone()))

    def decode(self, z: torch.Tensor) -> Any:
        self.seen.append((z.dtype, torch.is_grad_enabled()))
        return SimpleNamespace(sample=z.clone())


@pytest.mark.parametrize("shift", [None, 0.25])
def test_kl_latents_shift_and_scale_the_mean_and_invert_it(shift: float | None) -> None:
    vae = FakeKL(shift, 0.5)
    pixels = torch.linspace(-1, 1, 12).reshape(1, 3, 2, 2).to(torch.bfloat16)
    latents = kl_latents.encode(vae, pixels, torch.device("cpu"))
    assert latents.dtype == torch.float32
    assert torch.allclose(latents, (pixels.float() - (shift or 0.0)) * 0.5)
    back = kl_latents.decode(vae, latents.to(torch.bfloat16), torch.device("cpu"))
    assert back.dtype == torch.float32 and torch.allclose(back, pixels.float(), atol=1e-2)
    # Both run in float32 without autograd: the VAE stays frozen and in float32.
    assert vae.seen == [(torch.float32, False), (torch.float32, False)]
