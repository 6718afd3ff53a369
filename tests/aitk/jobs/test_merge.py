"""`job: mod` (rescale) and `job: merge` on the example arch, through the job runner: a
rescaled LoRA at weight 1 is the original at weight s, a merge of two LoRAs is applying
both (exactly, or within the SVD error it reports), and a merge into the model saves a
model whose predictions are the base's with both LoRAs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from aitk.adapters.hooks import LoraHooks
from aitk.config.loading import load_config
from aitk.errors import EXIT_INPUT as EXIT_CONFIG
from aitk.errors import EXIT_OK
from aitk.models.registry import load_model
from aitk.run.job import run_job
from tests.aitk.aitk_testing import write_config
from tests.aitk.models.conftest import ModelCfg, NetCfg


@pytest.fixture(scope="module")
def base(example_model_dir: Path):
    return load_model(ModelCfg(name_or_path=str(example_model_dir)))


def _lora(example_model_dir: Path, path: Path, seed: int, rank: int, alpha: float) -> Path:
    """A trained-looking LoRA file of the example arch (random up and down)."""
    from aitk.adapters import AdapterNetwork

    model = load_model(ModelCfg(name_or_path=str(example_model_dir)))
    net = AdapterNetwork.attach(model, NetCfg(linear=rank, linear_alpha=alpha))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    net.save_file(path, {"software": json.dumps({"name": "aitk"})})
    return path


@pytest.fixture(scope="module")
def loras(tmp_path_factory, example_model_dir):
    folder = tmp_path_factory.mktemp("loras")
    return (_lora(example_model_dir, folder / "a.safetensors", 1, rank=4, alpha=2.0),
            _lora(example_model_dir, folder / "b.safetensors", 2, rank=2, alpha=2.0))


@pytest.fixture(scope="module")
def inputs(base):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=gen)
    t = torch.tensor([250.0, 750.0])
    return x, t, base.get_prompt_embeds(["a red circle", "a green square"])


def predict(model, inputs, loras=()):
    with torch.no_grad(), LoraHooks(model, list(loras)):
        return model.get_noise_prediction(*inputs)


def _run(tmp_path: Path, job: str, process: dict, name: str = "m") -> int:
    path = write_config(tmp_path / f"{job}.yaml", {"job": job, "config": {
        "name": name, "process": [process]}, "meta": {"name": "[name]", "note": "x"}})
    return run_job(load_config(str(path)))


@pytest.mark.parametrize("target", ["up_down", "alpha"])
@pytest.mark.parametrize("s", [2.5, -1.0, 0.3])
def test_rescale_by_s_equals_strength_s(tmp_path, base, loras, inputs, target, s):
    out = tmp_path / "rescaled.safetensors"
    assert _run(tmp_path, "mod", {"type": "rescale_lora", "input_path": str(loras[0]),
                                  "output_path": str(out), "current_weight": s,
                                  "target_weight": 1.0, "scale_target": target,
                                  "save_dtype": "fp32"}) == EXIT_OK
    want = predict(base, inputs, [(loras[0], s)])
    assert (predict(base, inputs, [(out, 1.0)]) - want).abs().max() < 1e-5
    assert (want - predict(base, inputs)).abs().max() > 1e-3  # the LoRA does something
    with safe_open(str(out), "pt") as fh, safe_open(str(loras[0]), "pt") as src:
        assert set(fh.keys()) <= set(src.keys()) | {k for k in fh.keys()
                                                     if k.endswith(".alpha")}
        assert json.loads(fh.metadata()["aitk_job"])["scale"] == s


def test_replace_meta_writes_the_jobs_meta(tmp_path, loras):
    out = tmp_path / "r.safetensors"
    assert _run(tmp_path, "mod", {"type": "rescale_lora", "input_path": str(loras[0]),
                                  "output_path": str(out), "current_weight": 6,
                                  "target_weight": 1, "replace_meta": True}) == EXIT_OK
    with safe_open(str(out), "pt") as fh:
        meta = fh.metadata()
    assert meta["note"] == "x" and meta["name"] == "m"  # `[name]` replaced


def test_merge_of_two_loras_equals_applying_both(tmp_path, base, loras, inputs):
    out = tmp_path / "merged.safetensors"
    process = {"type": "merge_loras", "output_path": str(out), "save_dtype": "fp32",
               "loras": [{"path": str(loras[0]), "weight": 0.7},
                         {"path": str(loras[1]), "strength": -1.3}]}
    assert _run(tmp_path, "merge", process) == EXIT_OK
    want = predict(base, inputs, [(loras[0], 0.7), (loras[1], -1.3)])
    assert (predict(base, inputs, [(out, 1.0)]) - want).abs().max() < 1e-5
    with safe_open(str(out), "pt") as fh:
        made = json.loads(fh.metadata()["aitk_job"])
        down = next(fh.get_tensor(k) for k in fh.keys() if k.endswith("lora_A.weight"))
    assert made["method"] == "exact" and made["max_error"] == 0.0
    assert down.shape[0] == 4 + 2  # the ranks side by side


def test_a_rank_limited_merge_reports_its_error(tmp_path, base, loras, inputs, capsys):
    out = tmp_path / "merged3.safetensors"
    process = {"type": "merge_loras", "output_path": str(out), "rank": 3,
               "save_dtype": "fp32",
               "loras": [{"path": str(loras[0])}, {"path": str(loras[1])}]}
    assert _run(tmp_path, "merge", process) == EXIT_OK
    with safe_open(str(out), "pt") as fh:
        made = json.loads(fh.metadata()["aitk_job"])
    assert made["rank"] == 3 and 0 < made["max_error"] < 1
    assert f"relative error max {made['max_error']:.3g}" in capsys.readouterr().err
    want = predict(base, inputs, [(loras[0], 1.0), (loras[1], 1.0)])
    got = predict(base, inputs, [(out, 1.0)])
    lost = (got - want).abs().max()
    assert 0 < lost < (want - predict(base, inputs)).abs().max()  # closer than no LoRA


def test_merge_into_the_model_saves_the_base_with_both_loras(tmp_path, base, loras,
                                                             inputs, example_model_dir):
    out = tmp_path / "merged_model"
    process = {"type": "merge_into_model", "output_path": str(out), "save_dtype": "fp32",
               "model": {"name_or_path": str(example_model_dir), "arch": "example"},
               "loras": [{"path": str(loras[0]), "weight": 0.5},
                         {"path": str(loras[1]), "weight": 1.0}]}
    assert _run(tmp_path, "merge", process) == EXIT_OK
    merged = load_model(ModelCfg(name_or_path=str(out)))
    want = predict(base, inputs, [(loras[0], 0.5), (loras[1], 1.0)])
    assert (predict(merged, inputs) - want).abs().max() < 1e-5
    assert (out / "aitk_model.json").is_file() and (out / "vae").is_dir()


def test_a_users_file_at_the_output_is_never_overwritten(tmp_path, loras, capsys):
    out = tmp_path / "theirs.safetensors"
    out.write_bytes(b"someone's file")
    assert _run(tmp_path, "mod", {"type": "rescale_lora", "input_path": str(loras[0]),
                                  "output_path": str(out), "current_weight": 2,
                                  "target_weight": 1}) == EXIT_CONFIG
    assert out.read_bytes() == b"someone's file"
    assert "was not written by aitk and would be overwritten" in capsys.readouterr().err
