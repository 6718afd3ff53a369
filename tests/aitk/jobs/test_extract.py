"""`job: extract` on the example arch: a fine-tune made as base + a known low-rank delta
gives that delta back, in the arch's LoRA layout, and the LoRA on the base reproduces
the fine-tune."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aitk.config.loading import load_config
from aitk.errors import EXIT_INPUT as EXIT_CONFIG
from aitk.errors import EXIT_OK
from aitk.run.job import run_job
from tests.aitk.aitk_testing import write_config

WEIGHTS = Path("transformer") / "diffusion_pytorch_model.safetensors"
CHANGED = ("blocks.0.attn.to_q", "blocks.1.mlp.fc1")  # two Linear layers under blocks.


def _linear_layers(state: dict[str, torch.Tensor]) -> list[str]:
    return [k[: -len(".weight")] for k, v in state.items()
            if k.startswith("blocks.") and k.endswith(".weight") and v.ndim == 2]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, example_model_dir: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A copy of the example model with a rank-2 delta added to two layers."""
    tuned = tmp_path_factory.mktemp("tuned") / "model"
    shutil.copytree(example_model_dir, tuned)
    state = load_file(str(tuned / WEIGHTS))
    assert set(CHANGED) <= set(_linear_layers(state)), _linear_layers(state)
    gen = torch.Generator().manual_seed(3)
    deltas = {}
    for layer in CHANGED:
        w = state[f"{layer}.weight"]
        up = torch.randn(w.shape[0], 2, generator=gen) * 0.1
        down = torch.randn(2, w.shape[1], generator=gen) * 0.1
        deltas[layer] = up @ down
        state[f"{layer}.weight"] = w + deltas[layer]
    save_file(state, str(tuned / WEIGHTS))
    return tuned, deltas


def _job(tmp_path: Path, base: Path, tuned: Path, **process) -> Path:
    config = {"job": "extract", "config": {
        "name": "extracted", "base_model": str(base), "extract_model": str(tuned),
        "output_folder": str(tmp_path / "out"), "dtype": "fp32", "device": "cpu",
        "process": [{"type": "lora", "filename": "[name]_r2.safetensors", "mode": "fixed",
                     "linear": 2, **process}]}}
    return write_config(tmp_path / "extract.yaml", config)


def _deltas(path: Path) -> dict[str, torch.Tensor]:
    sd = load_file(str(path))
    out = {}
    for key in sd:
        if key.endswith(".lora_A.weight"):
            stem = key[: -len(".lora_A.weight")]
            down, up = sd[key], sd[f"{stem}.lora_B.weight"]
            scale = float(sd[f"{stem}.alpha"]) / down.shape[0]
            out[stem] = up @ down * scale
    return out


def test_extract_recovers_a_known_low_rank_delta(tmp_path, example_model_dir, finetuned):
    tuned, expected = finetuned
    loaded = load_config(str(_job(tmp_path, example_model_dir, tuned)))
    assert loaded.job.config.arch == "example"  # read from the folder: no flag says it
    assert run_job(loaded) == EXIT_OK
    out = tmp_path / "out" / "extracted_r2.safetensors"
    got = _deltas(out)
    # The example arch's layout: `diffusion_model.` + the layer's name, alpha beside.
    assert set(got) == {f"diffusion_model.{layer}" for layer in CHANGED}  # the rest unchanged
    for layer, delta in expected.items():
        assert (got[f"diffusion_model.{layer}"] - delta).abs().max() < 1e-4
    with safe_open(str(out), "pt") as fh:
        meta = fh.metadata()
    assert '"name": "aitk"' in meta["software"] and meta["base_model_arch"] == "example"


def test_the_extracted_lora_on_the_base_is_the_fine_tune(tmp_path, example_model_dir,
                                                          finetuned):
    from aitk.adapters.hooks import LoraHooks
    from aitk.models.registry import load_model
    from tests.aitk.models.conftest import ModelCfg

    tuned, _ = finetuned
    loaded = load_config(str(_job(tmp_path, example_model_dir, tuned, mode="quantile",
                                  linear=0.999)))
    assert run_job(loaded) == EXIT_OK
    out = next((tmp_path / "out").glob("*.safetensors"))
    base = load_model(ModelCfg(name_or_path=str(example_model_dir)))
    fine = load_model(ModelCfg(name_or_path=str(tuned)))
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([300.0, 800.0])
    embeds = base.get_prompt_embeds(["a red circle", "a blue square"])
    with torch.no_grad():
        want = fine.get_noise_prediction(x, t, embeds)
        before = base.get_noise_prediction(x, t, embeds)
        with LoraHooks(base, [(out, 1.0)]):
            got = base.get_noise_prediction(x, t, embeds)
    assert (want - before).abs().max() > 1e-3  # the fine-tune does differ
    assert (got - want).abs().max() < 1e-4


def test_identical_models_have_nothing_to_extract(tmp_path, example_model_dir, capsys):
    from aitk.cli.run import main as run_main

    same = tmp_path / "same"
    shutil.copytree(example_model_dir, same)
    config = _job(tmp_path, example_model_dir, same)
    assert run_job(load_config(str(config))) == EXIT_CONFIG
    assert "do not differ in any layer a LoRA trains" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written
    # The preflight (`run.py --check`) already says so when both name one folder.
    config = _job(tmp_path, example_model_dir, example_model_dir)
    assert run_main([str(config), "--check"]) == EXIT_CONFIG
    assert "config.extract_model: is the base model itself" in capsys.readouterr().err
    # ... and so does `--check --json` (the web UI's check): a finding of the job, not
    # of one process, comes with the first process's record.
    assert run_main([str(config), "--check", "--json"]) == EXIT_CONFIG
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["ok"] is False
    assert [p["path"] for p in record["problems"] if p["level"] == "error"] == [
        "config.extract_model"]
