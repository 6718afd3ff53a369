from __future__ import annotations

from pathlib import Path

import pytest
import torch
from optimum.quanto import QModuleMixin
from torch import nn

from aitk.adapters import AdapterNetwork
from aitk.errors import QuantizeError
from aitk.models.quantize import is_quantized, linear_nd, quantize_linear_layers


def test_quantize_respects_exclude() -> None:
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    quantize_linear_layers(net, "qfloat8", exclude=["2"])
    assert isinstance(net[0], QModuleMixin)
    assert not isinstance(net[2], QModuleMixin)
    assert is_quantized(net)


def test_unknown_qtype_and_bare_linear() -> None:
    with pytest.raises(QuantizeError, match="unknown qtype 'fp4'"):
        quantize_linear_layers(nn.Sequential(nn.Linear(2, 2)), "fp4")
    with pytest.raises(QuantizeError, match="pass the module that holds"):
        quantize_linear_layers(nn.Linear(2, 2))


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8"])
def test_4d_input_through_a_quantized_linear(qtype: str) -> None:
    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(8, 6))
    x = torch.randn(2, 3, 5, 8)
    float_out = holder(x)
    quantize_linear_layers(holder, qtype)
    layer = holder[0]
    seen = []
    layer.register_forward_pre_hook(lambda m, args: seen.append(args[0].dim()))
    out = linear_nd(layer, x)
    assert seen == [3]  # the kernel only ever sees 2-D/3-D activations
    assert out.shape == (2, 3, 5, 6)
    # the same numbers as the 3-D call, item by item
    assert torch.equal(out[1], layer(x[1]))
    assert torch.allclose(out, float_out, atol=0.1)  # and close to the float layer


def test_quantized_example_model_trains_a_lora(make_model, inputs, net_cfg) -> None:
    model = make_model(quantize=True, quantize_te=True)
    assert isinstance(model.model.blocks[0].attn.to_q, QModuleMixin)
    assert not isinstance(model.model.proj_out, QModuleMixin)  # excluded
    assert is_quantized(model.text_encoder)
    latents, timesteps, _ = inputs
    embeds = model.get_prompt_embeds(["a red square on grey", "cat"])
    net = AdapterNetwork.attach(model, net_cfg())
    pred = model.get_noise_prediction(latents, timesteps, embeds)
    pred.pow(2).mean().backward()
    grads = [p.grad for p in net.trainable_parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def _frozen(layer: nn.Module) -> bool:
    from optimum.quanto import QTensor

    return isinstance(layer, QModuleMixin) and isinstance(layer.weight, QTensor)


# qint4 builds quanto's C++ kernels on first use (minutes, once per machine): slow tier.
@pytest.mark.parametrize("qtype", ["qfloat8", "qint8",
                                   pytest.param("qint4", marks=pytest.mark.slow)])
def test_weights_are_frozen_to_smaller_tensors(qtype: str) -> None:
    from aitk.models.quantize import weight_bytes

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64))
    x = torch.randn(2, 3, 64)
    before, float_out = weight_bytes(net), net(x)
    quantize_linear_layers(net, qtype)
    assert _frozen(net[0]) and _frozen(net[1])  # the float weights are gone
    # 1 byte per weight (int4: half) plus scales; float32 is 4
    assert weight_bytes(net) < before * (0.2 if qtype == "qint4" else 0.3)
    assert torch.allclose(net(x), float_out, atol=0.3)


def test_units_are_quantized_and_frozen_one_after_another() -> None:
    """When a unit is done, the units after it are still float: float and quantized
    copies of the whole model never exist at once."""
    net = nn.Module()
    net.embed = nn.Linear(8, 8)
    net.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
                               for _ in range(3))
    net.out = nn.Linear(8, 8)
    seen: list[tuple[str, list[bool]]] = []

    def progress(name: str) -> None:
        seen.append((name, [_frozen(b[0]) for b in net.blocks]))

    quantize_linear_layers(net, "qint8", exclude=["out"], progress=progress)
    assert seen == [("embed", [False] * 3), ("blocks.0", [True, False, False]),
                    ("blocks.1", [True, True, False]), ("blocks.2", [True] * 3),
                    ("out", [True] * 3)]
    assert _frozen(net.embed) and not isinstance(net.out, QModuleMixin)


@pytest.fixture
def spaced_torch_lib(tmp_path, monkeypatch):
    """torch's lib folder seen from a checkout under "new user" (a link to the real
    one), quanto's build folder restored and the kernel cache in tmp_path: (that lib
    path, quanto's extension)."""
    import torch.utils.cpp_extension as cpp_extension
    from optimum.quanto.library.extensions import get_extension

    spaced = tmp_path / "new user"
    spaced.mkdir()
    (spaced / "lib").symlink_to(cpp_extension.TORCH_LIB_PATH, target_is_directory=True)
    ext = get_extension("quanto_cpp")
    monkeypatch.setattr(cpp_extension, "TORCH_LIB_PATH", str(spaced / "lib"))
    monkeypatch.setattr(ext, "build_directory", ext.build_directory)
    monkeypatch.setenv("AITK_KERNEL_CACHE", str(tmp_path / "kernels"))
    return spaced / "lib", ext


def test_kernel_build_gets_a_space_free_torch_lib_path(tmp_path, spaced_torch_lib) -> None:
    """torch writes -L<torch>/lib unquoted into quanto's ninja file: a checkout under a
    folder with a space must link against a space-free path to the same folder."""
    import torch.utils.cpp_extension as cpp_extension

    from aitk.models import quantize

    lib, ext = spaced_torch_lib
    quantize.prepare_quanto_kernel_build.__wrapped__()
    assert " " not in cpp_extension.TORCH_LIB_PATH
    assert Path(cpp_extension.TORCH_LIB_PATH).resolve() == lib.resolve()
    assert ext.build_directory.startswith(str(tmp_path / "kernels"))


def test_a_stale_torch_lib_link_from_a_removed_checkout_is_replaced(tmp_path,
                                                                   spaced_torch_lib) -> None:
    """The kernel cache outlives checkouts: a link left by one that was removed (CI's
    temp clones, a user's moved folder) must not be what this checkout links against
    (ld: cannot find -ltorch_python, and qint4 fell back to uint4)."""
    import torch.utils.cpp_extension as cpp_extension

    from aitk.models import quantize

    lib, _ = spaced_torch_lib
    root = quantize.kernel_cache_dir()
    root.mkdir(parents=True)
    for old in (root / "torch-lib", root / quantize.torch_lib_link_name(lib)):
        old.symlink_to(tmp_path / "removed checkout" / "lib", target_is_directory=True)
    quantize.prepare_quanto_kernel_build.__wrapped__()
    assert Path(cpp_extension.TORCH_LIB_PATH).resolve() == lib.resolve()
    assert " " not in cpp_extension.TORCH_LIB_PATH
    assert Path(cpp_extension.TORCH_LIB_PATH).is_dir()  # not dangling
