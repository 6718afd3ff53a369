"""Upstream's memory and visibility keys are never silent: `layer_offloading*` and the
compile keys are read by the schema and act (aitk.models.block_offload,
aitk.models.block_compile); the others that change whether a run fits or what the
user sees warn once with what aitk does instead (upstream_keys.INSTEAD)."""

from __future__ import annotations

import copy

import pytest
import torch

from aitk.config import upstream_keys as uk
from aitk.config.loading import parse_job, read_config_file
from aitk.models.block_compile import CompileSettings, compile_blocks
from tests.aitk.aitk_testing import REPO

EXAMPLE = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"


def parsed(section: str, values: dict):
    r = copy.deepcopy(read_config_file(EXAMPLE))
    proc = r["config"]["process"][0]
    proc.setdefault(section, {}).update(values)
    return parse_job(r, "job.yml", env={}, check_arch=lambda a: None)


@pytest.mark.parametrize(("section", "key", "value"), [
    ("model", "split_model_over_gpus", True), ("model", "auto_memory", True),
    ("model", "vae_device", "cpu"), ("model", "te_device", "cpu"),
    ("network", "layer_offloading", True)])
def test_each_key_warns_once_with_what_aitk_does_instead(section, key, value):
    loaded = parsed(section, {key: value})
    said = [w for w in loaded.warnings if f".{key}:" in w]
    assert len(said) == 1
    assert uk.INSTEAD[(section, key)] in said[0]
    assert "valid upstream but not acted on" not in said[0]


@pytest.mark.parametrize(("section", "key", "value"), [
    ("model", "split_model_over_gpus", False), ("model", "auto_memory", False)])
def test_upstream_defaults_say_nothing(section, key, value):
    assert not [w for w in parsed(section, {key: value}).warnings if key in w]


def test_offloading_and_compile_keys_are_read_not_warned_about():
    loaded = parsed("model", {
        "layer_offloading": True, "layer_offloading_transformer_percent": 0.4,
        "layer_offloading_text_encoder_percent": 0.5, "block_compile": True,
        "compile_mode": "max-autotune", "cache_size_limit": 64})
    model = loaded.job.config.process[0].model
    assert model.layer_offloading and model.layer_offloading_transformer_percent == 0.4
    assert model.layer_offloading_text_encoder_percent == 0.5
    assert model.block_compile and model.compile_mode == "max-autotune"
    assert model.cache_size_limit == 64
    assert not loaded.warnings
    for key in ("layer_offloading", "compile", "block_compile"):
        assert ("model", key) not in uk.QUIET and ("model", key) not in uk.INSTEAD


def test_block_compile_compiles_each_block_and_computes_the_same():
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(3)]
    x = torch.randn(2, 8)
    plain = [b(x) for b in blocks]
    assert compile_blocks(blocks, CompileSettings(backend="eager")) == 3
    for block, expected in zip(blocks, plain, strict=True):
        assert hasattr(block.forward, "_torchdynamo_orig_callable")  # torch.compile's
        assert torch.equal(block(x), expected)
