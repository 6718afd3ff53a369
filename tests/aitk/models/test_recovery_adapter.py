"""Accuracy recovery adapters (aitk.models.recovery_adapter): read as upstream writes
them, applied frozen on the quantized base, never saved with the trained LoRA; a file
that does not fit or cannot be had is one line, exit 2; training resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.errors import ModelLoadError
from aitk.models.registry import load_model
from aitk.models.uintx import UIntXLinear
from aitk.run.job import EXIT_OK, run_job
from tests.aitk.aitk_testing import job_config, write_config
from tests.aitk.models.conftest import ModelCfg, NetCfg
from tests.aitk.test_objective_resume import STEPS, final, stopped_then_resumed

COVERED = ("blocks.0.attn.to_q", "blocks.0.mlp.fc1", "blocks.1.attn.to_v")


def write_adapter(path: Path, model: nn.Module, names=COVERED, rank: int = 4,
                  seed: int = 0) -> Path:
    """An adapter file in upstream's layout: `diffusion_model.` + module names, lora_A /
    lora_B, no alpha (upstream applies alpha = rank)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name in names:
        layer = model.get_submodule(name)
        weights[f"diffusion_model.{name}.lora_A.weight"] = \
            torch.randn(rank, layer.in_features, generator=gen) * 0.1
        weights[f"diffusion_model.{name}.lora_B.weight"] = \
            torch.randn(layer.out_features, rank, generator=gen) * 0.1
    save_file(weights, str(path))
    return path


@pytest.fixture(scope="module")
def adapter(example_model_dir: Path, tmp_path_factory) -> Path:
    model = load_model(ModelCfg(name_or_path=str(example_model_dir))).model
    return write_adapter(tmp_path_factory.mktemp("ara") / "ara.safetensors", model)


@pytest.mark.parametrize("bits", [3, 4])
def test_adapter_is_applied_frozen_on_the_quantized_base(example_model_dir: Path,
                                                         adapter: Path, bits: int) -> None:
    from safetensors.torch import load_file

    m = load_model(ModelCfg(name_or_path=str(example_model_dir), quantize=True,
                            qtype=f"uint{bits}|{adapter}"))
    weights = load_file(str(adapter))
    for name, layer in m.model.named_modules():
        if not isinstance(layer, nn.Linear) or not name.startswith("blocks."):
            continue  # the arch keeps its embedders and output layers in float
        assert isinstance(layer, UIntXLinear), name
        # covered layers at the qtype, the rest at uint8, as upstream does
        assert layer.bits == (bits if name in COVERED else 8), name
    layer = m.model.get_submodule(COVERED[0])
    x = torch.randn(3, layer.in_features)
    down = weights[f"diffusion_model.{COVERED[0]}.lora_A.weight"]
    up = weights[f"diffusion_model.{COVERED[0]}.lora_B.weight"]
    base = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert torch.allclose(layer(x), base + x @ down.T @ up.T, atol=1e-5)

    # nothing of the adapter is a parameter, a buffer or a state-dict entry: the network
    # attached for training finds only its own weights to train and save
    before = {k: v.clone() for k, v in m.model.state_dict().items()
              if not hasattr(v, "dequantize")}
    net = AdapterNetwork.attach(m, NetCfg())
    assert all(p.requires_grad for p in net.trainable_parameters())
    assert sum(p.numel() for p in net.trainable_parameters()) > 0
    assert not any(p.requires_grad for p in m.model.parameters()
                   if all(p is not q for q in net.trainable_parameters()))
    assert set(before) <= set(m.model.state_dict()) | {
        k.replace(".base_layer", "") for k in m.model.state_dict()}


def test_the_same_file_named_by_accuracy_recovery_adapter(example_model_dir: Path,
                                                          adapter: Path) -> None:
    @__import__("dataclasses").dataclass
    class Cfg(ModelCfg):
        accuracy_recovery_adapter: str | None = None

    m = load_model(Cfg(name_or_path=str(example_model_dir), quantize=True, qtype="uint4",
                       accuracy_recovery_adapter=str(adapter)))
    assert m.model.get_submodule(COVERED[0])._forward_hooks


def test_an_adapter_for_another_model_names_the_first_mismatched_key(
        example_model_dir: Path, adapter: Path, tmp_path: Path) -> None:
    plain = load_model(ModelCfg(name_or_path=str(example_model_dir))).model
    other = nn.Module()
    other.blocks = nn.ModuleList([nn.Module()])
    other.blocks[0].nope = nn.Linear(64, 64)
    write_adapter(tmp_path / "other.safetensors", other, names=("blocks.0.nope",))
    with pytest.raises(ModelLoadError, match=r"first mismatched key "
                       r"blocks\.0\.nope\.lora_A\.weight \(not a Linear layer"):
        load_model(ModelCfg(name_or_path=str(example_model_dir), quantize=True,
                            qtype=f"uint4|{tmp_path / 'other.safetensors'}"))
    wide = nn.Module()
    wide.blocks = nn.ModuleList([nn.Module()])
    wide.blocks[0].attn = nn.Module()
    wide.blocks[0].attn.to_q = nn.Linear(128, 64)
    assert plain.get_submodule("blocks.0.attn.to_q").in_features == 64
    write_adapter(tmp_path / "wide.safetensors", wide, names=("blocks.0.attn.to_q",))
    with pytest.raises(ModelLoadError, match=r"blocks\.0\.attn\.to_q\.lora_A\.weight "
                       r"\(shape 64x128, the layer is 64x64\)"):
        load_model(ModelCfg(name_or_path=str(example_model_dir), quantize=True,
                            qtype=f"uint3|{tmp_path / 'wide.safetensors'}"))


def test_offline_without_the_file_is_one_line_exit_2(example_model_dir: Path,
                                                     tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf home"))
    with pytest.raises(ModelLoadError, match="accuracy recovery adapter x.safetensors from "
                       "hub id 'ostris/accuracy_recovery_adapters'") as info:
        load_model(ModelCfg(name_or_path=str(example_model_dir), quantize=True,
                            qtype="uint3|ostris/accuracy_recovery_adapters/x.safetensors"))
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(ModelCfg(name_or_path=str(example_model_dir), quantize=True,
                            qtype=f"uint3|{tmp_path / 'missing.safetensors'}"))


def _job(tmp: Path, name: str, model_dir: Path, qtype: str) -> Path:
    cfg = job_config(name, tmp / "out", model_dir, steps=STEPS,
                     model={"arch": "example", "name_or_path": str(model_dir),
                            "quantize": True, "quantize_te": False, "qtype": qtype},
                     save={"dtype": "float32", "save_every": 2,
                           "max_step_saves_to_keep": 4},
                     sample={"sample_every": 100, "prompts": []})
    return write_config(tmp / f"{name}.yml", cfg)


@pytest.mark.parametrize("bits", [4, 3])
def test_training_with_an_adapter_resumes_exactly_and_saves_only_the_lora(
        bits: int, tmp_path: Path, example_model_dir: Path, adapter: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    qtype = f"uint{bits}|{adapter}"
    assert run_job(load_config(str(_job(tmp_path, "straight", example_model_dir, qtype)))
                   ) == EXIT_OK
    stopped_then_resumed(_job(tmp_path, "resumed", example_model_dir, qtype), monkeypatch)
    a = final(tmp_path / "out" / "straight", "straight")
    b = final(tmp_path / "out" / "resumed", "resumed")
    assert a["adapter"].keys() == b["adapter"].keys()
    assert all(torch.equal(a["adapter"][k], b["adapter"][k]) for k in a["adapter"])
    assert all(torch.equal(a["lora"][k], b["lora"][k]) for k in a["lora"])
    assert a["losses"] == b["losses"]
    # the saved LoRA is the trained rank-4 network only: no recovery factors in it
    assert not any("recovery" in k for k in a["lora"])
    plain = tmp_path / "plain"
    plain.mkdir()
    assert run_job(load_config(str(_job(plain, "plain", example_model_dir, f"uint{bits}")))
                   ) == EXIT_OK
    assert final(plain / "out" / "plain", "plain")["lora"].keys() == a["lora"].keys()


def test_wan22_experts_take_their_own_layers_of_the_combined_adapter(tmp_path: Path) -> None:
    """Upstream fits one adapter to its combined Wan 2.2 model: `transformer_1.` layers
    go to the high-noise expert, `transformer_2.` ones to the low-noise expert."""
    from aitk.models.registry import get_model_class
    from tests.aitk.models.arch_checks import model_cfg

    cls = get_model_class("wan22_14b")
    cls.build_tiny(tmp_path / "wan22")
    plain = cls(model_cfg("wan22_14b", tmp_path / "wan22"))
    plain.load_model()
    combined = nn.Module()
    combined.transformer_1, combined.transformer_2 = plain.model.transformer, \
        plain.model.transformer_2
    path = write_adapter(tmp_path / "ara.safetensors", combined,
                         names=("transformer_1.blocks.0.attn1.to_q",
                                "transformer_2.blocks.0.attn1.to_k"))
    m = cls(model_cfg("wan22_14b", tmp_path / "wan22", quantize=True,
                      qtype=f"uint4|{path}"))
    m.load_model()
    hooked = {f"{e}.{n}" for e in ("transformer", "transformer_2")
              for n, layer in getattr(m.model, e).named_modules() if layer._forward_hooks}
    assert hooked == {"transformer.blocks.0.attn1.to_q", "transformer_2.blocks.0.attn1.to_k"}
