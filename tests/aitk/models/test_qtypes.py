"""Every upstream qtype a library implements (aitk.models.qtypes): parsing, the one-line
refusal of upstream's own formats, and each backend's layers (torchao's int8/float8,
aitk's packed uint2..uint8) quantizing, running and passing gradients to a LoRA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aitk.config.loading import parse_job
from aitk.errors import ConfigError, QuantizeError
from aitk.models.qtypes import QTYPE_NAMES, QTypeProblem, parse_qtype
from aitk.models.quantize import is_quantized, quantize_linear_layers, weight_bytes
from aitk.models.uintx import UIntXLinear, pack_codes, unpack_codes
from tests.aitk.test_config import example_raw, proc

UPSTREAM_UI_QTYPES = ("qfloat8", "qint8", "qint4", "uint2", "uint3", "uint4", "uint5",
                      "uint6", "uint7", "uint8", "float8", "int8")


def test_upstream_ui_choices_all_parse() -> None:
    assert set(UPSTREAM_UI_QTYPES) <= set(QTYPE_NAMES)
    adapter = "ostris/accuracy_recovery_adapters/qwen_image_torchao_uint3.safetensors"
    choice = parse_qtype(f"uint3|{adapter}")
    assert choice.qtype.name == "uint3" and choice.qtype.bits == 3
    assert choice.adapter == adapter
    assert parse_qtype("qfloat8").adapter is None


@pytest.mark.parametrize(("name", "nearest"), [("convrot4", "uint4"), ("nvfp4", "uint4"),
                                               ("convrotint3", "uint3")])
def test_formats_no_library_implements_name_the_nearest(name: str, nearest: str) -> None:
    with pytest.raises(QTypeProblem, match=f"nearest aitk runs is '{nearest}'"):
        parse_qtype(name)
    with pytest.raises(QTypeProblem, match="nothing after '|'"):
        parse_qtype("uint3|")


def test_config_with_an_unimplemented_qtype_is_one_config_error() -> None:
    raw = example_raw()
    proc(raw)["model"].update(quantize=True, qtype="convrot4")
    with pytest.raises(ConfigError) as info:
        parse_job(raw, "job.yml", env={}, check_arch=lambda a: None)
    assert info.value.exit_code == 2
    [line] = [p for p in info.value.problems if "qtype" in p]
    assert "'uint4'" in line and "\n" not in line


def test_two_different_adapters_are_refused() -> None:
    raw = example_raw()
    proc(raw)["model"].update(quantize=True, qtype="uint3|a.safetensors",
                              accuracy_recovery_adapter="b.safetensors")
    with pytest.raises(ConfigError, match="keep one"):
        parse_job(raw, "job.yml", env={}, check_arch=lambda a: None)
    proc(raw)["model"]["accuracy_recovery_adapter"] = "a.safetensors"
    model = parse_job(raw, "job.yml", env={}, check_arch=lambda a: None
                      ).job.config.process[0].model
    assert model.recovery_adapter == "a.safetensors"


@pytest.mark.parametrize("bits", range(2, 9))
def test_codes_pack_to_their_bit_width_and_back(bits: int) -> None:
    codes = torch.randint(0, 1 << bits, (37, 13), dtype=torch.uint8)
    planes = pack_codes(codes, bits)
    assert planes.numel() == bits * -(-codes.numel() // 8)  # bits/8 bytes per code
    assert torch.equal(unpack_codes(planes, codes.numel(), bits).view(37, 13), codes)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_uintx_layer_is_close_small_and_passes_gradients(bits: int) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(128, 32).to(torch.bfloat16)
    x = torch.randn(4, 128, dtype=torch.bfloat16, requires_grad=True)
    q = UIntXLinear(layer, bits)
    err = (q.weight.float() - layer.weight.float()).abs().max()
    # asymmetric: at most half a step of (max - min) / (2^bits - 1) per group
    span = layer.weight.float().view(32, 2, 64).amax(-1) - layer.weight.float().view(
        32, 2, 64).amin(-1)
    assert err <= span.max() / ((1 << bits) - 1) * 0.51 + 1e-2
    codes_bytes = q.codes.numel()
    assert codes_bytes == 128 * 32 * bits // 8
    q(x).float().sum().backward()
    # d(sum y)/dx = the column sums of the (dequantized) weight
    assert x.grad is not None
    assert torch.allclose(x.grad.float()[0], q.weight.float().sum(0), atol=0.1)


@pytest.mark.parametrize("qtype", ["int8", "float8", "uint4", "uint3"])
def test_each_backend_quantizes_a_network_that_still_learns(qtype: str) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64), nn.Linear(10, 3))
    x = torch.randn(2, 5, 64)
    before, float_out = weight_bytes(net[:2]), net[:2](x)
    quantize_linear_layers(net, qtype)
    assert is_quantized(net)
    assert weight_bytes(net[:2]) < before * 0.35  # float32 was 4 bytes a weight
    if qtype.startswith("uint"):
        assert type(net[2]) is nn.Linear  # 10 inputs: no group of 64, stays float
    out = net[:2](x)
    # relative error: about 2^-bits of the weights' range per group
    limit = {"int8": 0.02, "float8": 0.06, "uint4": 0.15, "uint3": 0.3}[qtype]
    assert (out - float_out).norm() / float_out.norm() < limit
    # a LoRA-like float layer beside the frozen base gets finite gradients
    side = nn.Linear(64, 64)
    (out + side(x)).pow(2).mean().backward()
    assert side.weight.grad is not None and torch.isfinite(side.weight.grad).all()


def test_quantize_error_for_a_refused_qtype() -> None:
    with pytest.raises(QuantizeError, match="nearest aitk runs is 'uint4'"):
        quantize_linear_layers(nn.Sequential(nn.Linear(64, 64)), "nvfp4")


@pytest.fixture(scope="module")
def spaced_example(example_model_dir, tmp_path_factory):
    """The example model in a folder whose path has a space, as a new user's checkout."""
    import shutil

    target = tmp_path_factory.mktemp("checkout") / "new user" / "example"
    shutil.copytree(example_model_dir, target)
    return target


# quanto's qint4/qint2 build a C++ kernel on first use (minutes, once per machine).
@pytest.mark.parametrize("qtype", [
    pytest.param(q, marks=pytest.mark.slow) if q in ("qint4", "qint2") else q
    for q in QTYPE_NAMES])
def test_every_qtype_trains_a_lora_from_a_path_with_a_space(spaced_example, qtype) -> None:
    from aitk.adapters import AdapterNetwork
    from aitk.models.registry import load_model
    from tests.aitk.models.conftest import ModelCfg, NetCfg

    model = load_model(ModelCfg(name_or_path=str(spaced_example), quantize=True,
                                quantize_te=True, qtype=qtype, qtype_te=qtype))
    assert " " in str(spaced_example) and is_quantized(model.model)
    net = AdapterNetwork.attach(model, NetCfg())
    latents = torch.randn(2, 4, 4, 4)
    embeds = model.get_prompt_embeds(["a red square", "cat"])
    pred = model.get_noise_prediction(latents, torch.tensor([300.0, 700.0]), embeds)
    pred.pow(2).mean().backward()
    grads = [p.grad for p in net.trainable_parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_a_kernel_that_cannot_build_falls_back_with_one_line(monkeypatch) -> None:
    from aitk.models import quantize

    monkeypatch.setattr(quantize, "quanto_kernel_problem", lambda: "no C++ compiler")
    said: list[str] = []
    assert quantize.resolve_qtype("qint4", said.append).name == "uint4"
    assert quantize.resolve_qtype("qint2", said.append).name == "uint2"
    assert len(said) == 2 and "no C++ compiler" in said[0] and "uint4" in said[0]
