"""A full fine-tune (a training process without `network`) on the example arch, in
process: it resumes exactly, its diffusers folder loads through the parts' own
`from_pretrained` and draws the trainer's preview, `only_if_contains` decides what
trains, the single-file format and pruning keep only aitk's outputs, and the text
encoder trains where the arch can."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from aitk.config.loading import load_config
from aitk.errors import EXIT_INPUT, EXIT_OK
from aitk.run.job import run_job
from tests.aitk.aitk_testing import job_config, write_config

WEIGHTS = Path("transformer") / "diffusion_pytorch_model.safetensors"


def fine_tune(root: Path, model_dir: Path, name: str = "ft", steps: int = 6, **over):
    sections = {"save": {"save_every": 3, "max_step_saves_to_keep": 1,
                         "save_format": "diffusers", "dtype": "float32"},
                "sample": {"sample_every": 6}, **over}
    cfg = job_config(name, root / "out", model_dir, steps=steps, **sections)
    del cfg["config"]["process"][0]["network"]
    return load_config(str(write_config(root / f"{name}.yml", cfg)))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, example_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("straight")
    assert run_job(fine_tune(root, example_model_dir)) == EXIT_OK
    return root / "out" / "ft"


def test_outputs_are_model_folders_at_upstreams_names(straight):
    assert sorted(p.name for p in straight.iterdir() if not p.name.startswith(".")) == [
        "checkpoints", "config.yaml", "ft", "ft_000000003", "loss_log.jsonl", "samples",
        "status.json"]
    ckpt = straight / "checkpoints" / "step_000000006"
    assert {"weights.safetensors", "optimizer.pt"} <= {p.name for p in ckpt.iterdir()}
    marker = json.loads((straight / "ft" / "aitk_model.json").read_text())
    assert "transformer/diffusion_pytorch_model.safetensors" in marker["files"]
    assert json.loads(marker["training_info"])["step"] == 6


def test_a_full_fine_tune_resumes_exactly(tmp_path, example_model_dir, straight):
    # Stopped at step 3 (its checkpoint is the step-3 save), then run on to step 6.
    assert run_job(fine_tune(tmp_path, example_model_dir, steps=3)) == EXIT_OK
    assert run_job(fine_tune(tmp_path, example_model_dir, steps=6)) == EXIT_OK
    got = load_file(tmp_path / "out" / "ft" / "ft" / WEIGHTS)
    want = load_file(straight / "ft" / WEIGHTS)
    base = load_file(example_model_dir / WEIGHTS)
    assert got.keys() == want.keys() == base.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in got) <= 1e-6
    assert max((want[k] - base[k]).abs().max().item() for k in got) > 1e-4  # it trained


def test_the_saved_folder_loads_and_draws_the_trainers_preview(straight):
    from aitk.models.registry import load_model
    from aitk.run.sampling import image_configs
    from tests.aitk.models.conftest import ModelCfg

    loaded = load_config(str(straight.parent.parent / "ft.yml"))
    proc = loaded.job.config.process[0]
    model = load_model(ModelCfg(name_or_path=str(straight / "ft")))  # from_pretrained
    config = image_configs(proc.sample, proc.trigger_word)[0]
    image = model.generate_images([config])[0]
    with Image.open(straight / "samples" / "000000006_0.png") as preview:
        assert np.array_equal(np.asarray(image), np.asarray(preview.convert("RGB")))


def test_only_if_contains_decides_what_trains(tmp_path, example_model_dir):
    loaded = fine_tune(tmp_path, example_model_dir, steps=2,
                       model={"arch": "example", "name_or_path": str(example_model_dir),
                              "only_if_contains": ["transformer.blocks.1."]},
                       save={"save_every": 2, "save_format": "safetensors",
                             "dtype": "float32"})
    assert run_job(loaded) == EXIT_OK
    out = tmp_path / "out" / "ft"
    got, base = load_file(out / "ft.safetensors"), load_file(example_model_dir / WEIGHTS)
    changed = {k for k in got if not torch.equal(got[k], base[k])}
    assert changed and all(k.startswith("blocks.1.") for k in changed)
    with safe_open(str(out / "ft.safetensors"), "pt") as fh:
        assert json.loads(fh.metadata()["software"])["name"] == "aitk"


def test_nothing_selected_is_one_line(tmp_path, example_model_dir, capsys):
    loaded = fine_tune(tmp_path, example_model_dir, steps=2,
                       model={"arch": "example", "name_or_path": str(example_model_dir),
                              "only_if_contains": ["no.such.layer"]})
    assert run_job(loaded) == EXIT_INPUT
    assert "leave no parameter to train" in capsys.readouterr().err


def test_step_outputs_are_pruned_and_a_users_folder_stops_the_run(tmp_path,
                                                                   example_model_dir,
                                                                   capsys):
    loaded = fine_tune(tmp_path, example_model_dir, steps=6,
                       save={"save_every": 2, "max_step_saves_to_keep": 1,
                             "save_format": "diffusers", "dtype": "float32"})
    assert run_job(loaded) == EXIT_OK
    out = tmp_path / "out" / "ft"
    assert sorted(p.name for p in out.glob("ft*")) == ["ft", "ft_000000004"]
    other = fine_tune(tmp_path, example_model_dir, name="mine")
    (tmp_path / "out" / "mine" / "mine").mkdir(parents=True)  # a user's folder
    assert run_job(other) == EXIT_INPUT
    assert "mine was not written by aitk and would be overwritten" in \
        capsys.readouterr().err


def test_the_text_encoder_trains_where_the_arch_can(tmp_path, example_model_dir):
    loaded = fine_tune(tmp_path, example_model_dir, steps=2,
                       train={"train_text_encoder": True, "cache_text_embeddings": False,
                              "lr": 1e-2, "batch_size": 2, "seed": 7},
                       save={"save_every": 2, "save_format": "diffusers",
                             "dtype": "float32"})
    assert run_job(loaded) == EXIT_OK
    te = Path("text_encoder") / "model.safetensors"
    got = load_file(tmp_path / "out" / "ft" / "ft" / te)
    base = load_file(example_model_dir / te)
    assert any(not torch.equal(got[k], base[k]) for k in got)


def test_ema_of_a_full_fine_tune_is_saved_and_resumes_exactly(tmp_path, example_model_dir):
    ema = {"train": {"ema_config": {"use_ema": True, "ema_decay": 0.5}}}
    straight = tmp_path / "straight"
    straight.mkdir()
    assert run_job(fine_tune(straight, example_model_dir, **ema)) == EXIT_OK
    assert run_job(fine_tune(tmp_path, example_model_dir, steps=3, **ema)) == EXIT_OK
    assert run_job(fine_tune(tmp_path, example_model_dir, steps=6, **ema)) == EXIT_OK
    out = straight / "out" / "ft"
    saved = load_file(out / "ft" / WEIGHTS)
    got = load_file(tmp_path / "out" / "ft" / "ft" / WEIGHTS)
    assert max((got[k] - saved[k]).abs().max().item() for k in saved) <= 1e-6
    # The folder holds the average, the checkpoint the raw weights beside it.
    ckpt = out / "checkpoints" / "step_000000006"
    assert (ckpt / "ema.pt").is_file()
    raw = load_file(ckpt / "weights.safetensors")
    assert max((saved[k] - raw[f"transformer.{k}"]).abs().max().item()
               for k in saved if f"transformer.{k}" in raw) > 1e-6


def test_the_preflight_refuses_a_prior_term_in_a_full_fine_tune(tmp_path, example_model_dir):
    from aitk.audit.preflight import preflight

    loaded = fine_tune(tmp_path, example_model_dir, steps=2,
                       train={"blank_prompt_preservation": True})
    found = [f for f in preflight(loaded) if f.code == "full_fine_tune"]
    assert [f.path for f in found] == ["config.process[0].train.blank_prompt_preservation"]
    assert run_job(loaded) == EXIT_INPUT  # the runner refuses it too


def test_a_trained_text_encoder_gets_text_encoder_lr(tmp_path, example_model_dir):
    from aitk.models.registry import load_model
    from aitk.run.assembly import parameter_groups
    from aitk.run.finetune import FullWeights

    loaded = fine_tune(tmp_path, example_model_dir, steps=2,
                       train={"train_text_encoder": True, "cache_text_embeddings": False,
                              "lr": 1e-4, "text_encoder_lr": 1e-5})
    proc = loaded.job.config.process[0]
    model = load_model(proc.model)
    weights = FullWeights(model, proc)
    groups = parameter_groups(weights, proc)
    encoder = {id(p) for p in model.text_encoder_parts()["text_encoder"].parameters()}
    assert len(groups) == 2 and groups[1]["lr_scale"] == pytest.approx(0.1)
    assert {id(p) for p in groups[1]["params"]} == encoder
    assert not encoder & {id(p) for p in groups[0]["params"]}


def test_unet_lr_is_the_denoisers_rate_in_a_full_fine_tune(tmp_path, example_model_dir):
    from aitk.models.registry import load_model
    from aitk.run.assembly import parameter_groups
    from aitk.run.finetune import FullWeights
    from aitk.run.optim import build_optimizer

    loaded = fine_tune(tmp_path, example_model_dir, steps=2,
                       train={"train_text_encoder": True, "cache_text_embeddings": False,
                              "lr": 1e-4, "unet_lr": 3e-4, "text_encoder_lr": 1e-5})
    proc = loaded.job.config.process[0]
    model = load_model(proc.model)
    groups = parameter_groups(FullWeights(model, proc), proc)
    denoiser = {id(p) for m in model.denoiser_parts().values() for p in m.parameters()}
    optimizer = build_optimizer("adamw", groups, proc.train.lr)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([3e-4, 1e-5])
    assert groups[0]["params"] and {id(p) for p in groups[0]["params"]} <= denoiser
