"""`train.validation_config` (aitk.run.validation): the same weights score the same loss
whatever the step, the inputs are keyed by image content, and a job logs the validation
loss beside the training loss and names its lowest step."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aitk.config.loading import load_config
from aitk.run.job import EXIT_OK, run_job
from aitk.run.metrics import is_loss_log
from aitk.run.status import StatusFile
from aitk.run.validation import Validation, history, hold_out, image_noise
from aitk_server.outputs import loss_points
from tests.aitk.aitk_testing import REPO, TinyAdapter, job_config, write_config, write_image


def config(*images: Path, sigmas=(1.0, 0.5, 0.25)):
    return SimpleNamespace(validation_items=[SimpleNamespace(image_path=str(p),
                                                              prompt="[trigger] a thing")
                                             for p in images],
                           resolution=32, validation_sigmas=list(sigmas))


def held_images(model, tmp_path: Path, say=print):
    a = write_image(tmp_path / "val" / "a.png", (32, 32), (200, 30, 30))
    b = write_image(tmp_path / "val" / "b.png", (48, 32), (30, 30, 200))
    cfg = config(a, b)
    embeds = model.encode_prompts(["p1x a thing"])
    return cfg, hold_out(model, cfg, "p1x", embeds, say)


def test_same_weights_score_the_same_whatever_the_step(tiny_model, tmp_path: Path):
    TinyAdapter(tiny_model)
    cfg, held = held_images(tiny_model, tmp_path)
    records: list[dict] = []
    status = StatusFile(None)
    validate = Validation(tiny_model, held, cfg.validation_sigmas, contextlib.nullcontext,
                          records.append, status, lambda m: None)
    rng = torch.get_rng_state()
    first = validate(3)
    torch.randn(100)  # whatever training draws in between
    assert validate(250) == first
    assert validate(1000) == first
    assert [r["step"] for r in records] == [3, 250, 1000]
    assert all(r["val_loss"] == first for r in records)
    assert status.status.best_val_step == 3 and status.status.best_val_loss == first
    rng_after = torch.get_rng_state()
    torch.set_rng_state(rng)
    torch.randn(100)
    assert torch.equal(rng_after, torch.get_rng_state())  # validating drew nothing


def test_the_noise_follows_the_images_content_not_its_place_or_the_step(tiny_model,
                                                                        tmp_path: Path):
    cfg, held = held_images(tiny_model, tmp_path)
    again = hold_out(tiny_model, config(*[Path(v.image_path)
                                          for v in reversed(cfg.validation_items)]),
                     "p1x", tiny_model.encode_prompts(["p1x a thing"]), print)
    assert torch.equal(held[0].noise, again[1].noise)  # reordered: same noise per image
    assert not torch.equal(held[0].noise[..., :8, :8], held[1].noise[..., :8, :8])
    like = torch.zeros(1, 4, 8, 8)
    assert torch.equal(image_noise("ab" * 32, like), image_noise("ab" * 32, like))
    assert not torch.equal(image_noise("ab" * 32, like), image_noise("cd" * 32, like))


def test_a_changed_adapter_changes_the_score(tiny_model, tmp_path: Path):
    adapter = TinyAdapter(tiny_model)
    cfg, held = held_images(tiny_model, tmp_path)
    validate = Validation(tiny_model, held, cfg.validation_sigmas, contextlib.nullcontext,
                          lambda r: None, StatusFile(None), lambda m: None)
    before = validate(0)
    with torch.no_grad():
        adapter.delta.fill_(0.5)
    assert validate(1) != before
    assert validate.summary() is not None


def test_a_missing_validation_image_is_reported_and_left_out(tiny_model, tmp_path: Path):
    said: list[str] = []
    good = write_image(tmp_path / "a.png", (32, 32))
    held = hold_out(tiny_model, config(tmp_path / "gone.png", good), "p1x",
                    tiny_model.encode_prompts(["p1x a thing"]), said.append)
    assert len(held) == 1 and len(said) == 1 and "gone.png" in said[0]


def test_a_job_logs_validation_beside_training_and_names_the_lowest_step(
        tmp_path: Path, example_model_dir: Path):
    image = REPO / "datasets" / "example" / "red_circle_blue.png"
    cfg = job_config("val", tmp_path / "out", example_model_dir, steps=4,
                     sample={"sample_every": 100, "prompts": []},
                     train={"validation_config": {
                         "validation_items": [{"image_path": str(image),
                                               "prompt": "[trigger] a red circle"}],
                         "resolution": 32, "validate_every_n_steps": 2,
                         "validation_sigmas": [0.5]}})
    path = write_config(tmp_path / "val.yml", cfg)
    assert run_job(load_config(str(path))) == EXIT_OK
    out = tmp_path / "out" / "val"
    entries = [json.loads(line) for line in (out / "loss_log.jsonl").read_text().splitlines()]
    val = [(e["step"], e["val_loss"]) for e in entries if "val_loss" in e]
    assert [s for s, _ in val] == [0, 2, 4]
    assert [e["step"] for e in entries if "loss" in e] == [1, 2, 3, 4]
    assert is_loss_log(out / "loss_log.jsonl")  # a resume still appends to it
    assert [p[0] for p in loss_points(out)] == [1, 2, 3, 4]  # the UI's reader skips them
    status = json.loads((out / "status.json").read_text())
    best = min(val, key=lambda e: e[1])
    assert (status["best_val_step"], status["best_val_loss"]) == best
    assert history(out / "loss_log.jsonl", 2) == val[:2]


def test_the_schema_takes_upstreams_validation_keys():
    from aitk.config.schema import TrainConfig

    cfg = TrainConfig(validation_config={"validation_items": [{"image_path": "x.png",
                                                               "prompt": "p"}],
                                         "resolution": 1024, "validate_every_n_steps": 1,
                                         "validation_sigmas": [0.5]})
    assert cfg.validation_config.validate_every_n_steps == 1
    with pytest.raises(ValueError):
        TrainConfig(validation_config={"validation_sigmas": [1.5]})
