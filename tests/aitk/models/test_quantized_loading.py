"""Quantizing while loading (aitk.models.quantized_loading): the same model as
from_pretrained + quantization, built block by block, for the transformer and the text
encoder; and (slow) the peak RSS it buys."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from diffusers import FluxTransformer2DModel
from torch import nn
from transformers import T5EncoderModel

from aitk.models import quantized_loading
from aitk.models.flux.model import TRANSFORMER_QUANT_EXCLUDE
from aitk.models.flux.tiny import FluxSizes, build_tiny_flux
from aitk.models.loading import load_part
from aitk.models.quantize import quantize_linear_layers
from tests.aitk.aitk_testing import REPO

SIZES = FluxSizes(num_layers=2, num_single_layers=2, attention_head_dim=32,
                  axes_dims_rope=(8, 12, 12), text_dim=64, text_layers=2)


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory) -> Path:
    return build_tiny_flux(tmp_path_factory.mktemp("tiny flux") / "flux", sizes=SIZES)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every Linear's weight as floats (dequantized) and every other tensor."""
    out = {}
    for name, layer in module.named_modules():
        if isinstance(layer, nn.Linear):
            w = layer.weight
            out[f"{name}.weight"] = (w.dequantize() if hasattr(w, "dequantize") else w
                                     ).detach().float()
    for name, t in (*module.named_parameters(), *module.named_buffers()):
        if name.rpartition(".")[0] + ".weight" not in out:
            out.setdefault(name, t.detach().float() if not hasattr(t, "dequantize")
                           else t.dequantize().float())
    return out


def _no_fallback(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("fell back to from_pretrained + quantization")

    monkeypatch.setattr(quantized_loading, "load_part", refuse)
    monkeypatch.setattr(quantized_loading, "quantize_linear_layers", refuse)


@pytest.mark.parametrize("qtype", ["qfloat8", "uint4", "int8"])
@pytest.mark.parametrize(("cls", "subfolder", "exclude", "dtype_key"), [
    (FluxTransformer2DModel, "transformer", TRANSFORMER_QUANT_EXCLUDE, "torch_dtype"),
    (T5EncoderModel, "text_encoder_2", (), "dtype")])
def test_blockwise_loading_gives_what_from_pretrained_and_quantizing_give(
        flux_dir, monkeypatch, qtype, cls, subfolder, exclude, dtype_key) -> None:
    kw = {dtype_key: torch.bfloat16}
    want = quantize_linear_layers(load_part(cls, str(flux_dir), subfolder, "flux", **kw),
                                  qtype, exclude=exclude)
    _no_fallback(monkeypatch)
    got = quantized_loading.load_part_quantized(cls, str(flux_dir), subfolder, "flux",
                                                qtype, exclude=exclude, **kw)
    a, b = _weights(want), _weights(got)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    assert [type(m) for m in want.modules()] == [type(m) for m in got.modules()]


def test_each_block_is_quantized_before_the_next_is_read(flux_dir, monkeypatch) -> None:
    _no_fallback(monkeypatch)
    seen: list[tuple[str, bool, bool]] = []
    holder: dict[str, nn.Module] = {}
    real_plan = quantized_loading._plan

    def plan(cls, folder):
        model, files = real_plan(cls, folder)
        holder["model"] = model
        return model, files

    def progress(name: str) -> None:
        blocks = holder["model"].transformer_blocks
        seen.append((name, blocks[0].attn.to_q.weight.is_meta,
                     blocks[1].attn.to_q.weight.is_meta))

    monkeypatch.setattr(quantized_loading, "_plan", plan)
    quantized_loading.load_part_quantized(FluxTransformer2DModel, str(flux_dir),
                                          "transformer", "flux", "qfloat8",
                                          torch_dtype=torch.bfloat16, progress=progress)
    # when block 0 is done (quantized), block 1 has not been read yet
    assert ("transformer_blocks.0", False, True) in seen


def test_a_layout_the_model_lacks_falls_back_to_the_library(flux_dir, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    part = tmp_path / "m" / "transformer"
    part.mkdir(parents=True)
    (part / "config.json").write_text((flux_dir / "transformer" / "config.json").read_text())
    weights = load_file(str(next((flux_dir / "transformer").glob("*.safetensors"))))
    weights["renamed.extra"] = torch.zeros(1)
    save_file(weights, str(part / "diffusion_pytorch_model.safetensors"))
    assert quantized_loading._plan(FluxTransformer2DModel, part) is None


CHILD = textwrap.dedent("""
    import json, resource, sys, torch
    sys.path.insert(0, sys.argv[1])
    torch.set_num_threads(1)
    from diffusers import FluxTransformer2DModel
    from aitk.models.flux.model import TRANSFORMER_QUANT_EXCLUDE
    from aitk.models.loading import load_part
    from aitk.models.quantized_loading import load_part_quantized
    folder, qtype = sys.argv[2], sys.argv[3]
    if qtype == "float32":
        model = load_part(FluxTransformer2DModel, folder, "transformer", "flux",
                          torch_dtype=torch.float32)
    else:
        model = load_part_quantized(FluxTransformer2DModel, folder, "transformer", "flux",
                                    qtype, exclude=TRANSFORMER_QUANT_EXCLUDE,
                                    torch_dtype=torch.float32)
    # One forward touches every weight (a float32 load maps the file lazily; a run
    # reads all of it): 16 image tokens, 8 text tokens.
    c = model.config
    with torch.no_grad():
        model(hidden_states=torch.randn(1, 16, c.in_channels),
              encoder_hidden_states=torch.randn(1, 8, c.joint_attention_dim),
              pooled_projections=torch.randn(1, c.pooled_projection_dim),
              timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3),
              txt_ids=torch.zeros(8, 3), guidance=torch.tensor([1.0]))
    print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
""")


@pytest.mark.slow
def test_qfloat8_peak_rss_is_at_most_three_quarters_of_float32(tmp_path) -> None:
    """The issue's criterion on a smaller model: a ~190M-parameter float32 Flux
    transformer file (one double and ten single blocks, hidden 1024); peak RSS of the
    whole process (imports included) loading it and running one forward. Measured on a
    2-core box: float32 1211 MiB, qfloat8 834 MiB (0.69)."""
    from aitk.models.flux.tiny import build_tiny_flux as build

    folder = build(tmp_path / "mid flux", sizes=FluxSizes(
        num_layers=1, num_single_layers=10, attention_head_dim=128,
        num_attention_heads=8, axes_dims_rope=(16, 56, 56), text_dim=64))
    peaks = {}
    for qtype in ("float32", "qfloat8"):
        # Through a shell that forks (`; exit`: no exec of the last command): Linux
        # carries the high-water RSS of the process that calls exec into ru_maxrss, and
        # a child spawned from pytest would start with pytest's own.
        out = subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', sys.executable,
                              "-c", CHILD, str(REPO), str(folder), qtype],
                             capture_output=True, text=True, timeout=600, check=True)
        peaks[qtype] = json.loads(out.stdout.strip().splitlines()[-1])["peak_kib"]
    assert peaks["qfloat8"] <= 0.75 * peaks["float32"], peaks
