"""`train.ema_config`: the adapter's moving average equals the hand-rolled one, is what a
job saves, and survives a checkpoint (aitk.run.ema)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aitk.config.loading import load_config
from aitk.run.ema import AdapterEMA
from aitk.run.job import EXIT_OK, run_job
from aitk.run.train import LoopSettings, train
from tests.aitk.aitk_testing import TinyAdapter, job_config, write_config
from tests.aitk.test_train import batches, make_run


def test_ema_is_the_hand_rolled_average_of_the_adapters_steps(tiny_model):
    adapter = TinyAdapter(tiny_model)
    ema = AdapterEMA(adapter.trainable_parameters(), decay=0.8)
    seen: list[torch.Tensor] = []
    run = make_run(tiny_model, adapter, LoopSettings(total_steps=5, save_every=100),
                   batches(tiny_model), [])

    def update() -> None:
        seen.append(adapter.delta.detach().clone())
        ema.update()

    run.after_update = update
    train(run, 0)
    average = seen[0]  # the first update takes the weights (diffusers' EMAModel)
    for weights in seen[1:]:
        average = 0.8 * average + 0.2 * weights
    assert len(seen) == 5 and not torch.equal(seen[0], seen[-1])
    assert torch.allclose(ema.weights[0], average, atol=1e-7)
    trained = adapter.delta.detach().clone()
    with ema.applied():
        assert torch.allclose(adapter.delta, average, atol=1e-7)
    assert torch.equal(adapter.delta, trained)  # the trained weights are back


def test_ema_state_round_trips_and_keeps_this_runs_decay(tiny_model):
    adapter = TinyAdapter(tiny_model)
    ema = AdapterEMA(adapter.trainable_parameters(), decay=0.9)
    for value in (1.0, 2.0, 3.0):
        with torch.no_grad():
            adapter.delta.fill_(value)
        ema.update()
    again = AdapterEMA(adapter.trainable_parameters(), decay=0.5)
    again.load_state_dict(ema.state_dict())
    assert torch.equal(again.weights[0], ema.weights[0])
    with torch.no_grad():
        adapter.delta.fill_(4.0)
    again.update()
    assert torch.allclose(again.weights[0], 0.5 * ema.weights[0] + 0.5 * 4.0)


def test_a_job_saves_the_average_and_keeps_it_in_the_checkpoint(tmp_path: Path,
                                                                example_model_dir: Path):
    cfg = job_config("ema", tmp_path / "out", example_model_dir, steps=3,
                     train={"ema_config": {"use_ema": True, "ema_decay": 0.5}},
                     save={"save_every": 3, "dtype": "float32"},
                     sample={"sample_every": 100, "prompts": []})
    assert run_job(load_config(str(write_config(tmp_path / "ema.yml", cfg)))) == EXIT_OK
    out = tmp_path / "out" / "ema"
    ckpt = out / "checkpoints" / "step_000000003"
    raw = load_file(ckpt / "adapter.safetensors")
    state = torch.load(ckpt / "ema.pt", weights_only=True)
    lora = load_file(out / "ema.safetensors")
    b_keys = sorted(k for k in raw if k.endswith("lora_B.weight"))
    assert state["decay"] == 0.5 and len(state["shadow_params"]) == len(raw)
    # The LoRA file holds the average, not the last trained weights.
    saved_b = [v for k, v in sorted(lora.items()) if k.endswith("lora_B.weight")]
    raw_b = [raw[k] for k in b_keys]
    assert raw_b and len(saved_b) == len(raw_b)
    assert any(not torch.allclose(s, r) for s, r in zip(saved_b, raw_b, strict=True))
    shadow_norm = sum(float(p.norm()) ** 2 for p in state["shadow_params"]) ** 0.5
    saved_norm = sum(float(v.norm()) ** 2 for k, v in lora.items()
                     if k.endswith(("lora_A.weight", "lora_B.weight"))) ** 0.5
    assert saved_norm == pytest.approx(shadow_norm, rel=1e-5)


def test_feedback_pulls_the_trained_weights_toward_the_average_as_upstream_does(tiny_model):
    """`use_feedback`: after each update the trained weights move toward the average as it
    stood before the update by 10 x (1 - decay) of the gap (upstream's toolkit/ema.py),
    and `param_multiplier` then scales them; the average itself follows the weights the
    optimizer made, as without feedback."""
    adapter = TinyAdapter(tiny_model)
    decay, multiplier = 0.95, 0.9
    ema = AdapterEMA(adapter.trainable_parameters(), decay=decay, feedback=True,
                     param_multiplier=multiplier)
    plain = AdapterEMA([torch.nn.Parameter(adapter.delta.detach().clone())], decay=decay)
    before = adapter.delta.detach().clone()  # the average starts at the untrained weights
    seen: list[torch.Tensor] = []
    run = make_run(tiny_model, adapter, LoopSettings(total_steps=4, save_every=100),
                   batches(tiny_model), [])

    def update() -> None:
        nonlocal before
        stepped = adapter.delta.detach().clone()  # what the optimizer made
        with torch.no_grad():
            plain.params[0].copy_(stepped)
        plain.update()
        ema.update()
        expected = (stepped + 10 * (1 - decay) * (before - stepped)) * multiplier
        seen.append(stepped)
        assert torch.allclose(adapter.delta, expected, atol=1e-7)
        assert torch.allclose(ema.weights[0], plain.weights[0], atol=1e-7)
        before = ema.weights[0].clone()

    run.after_update = update
    train(run, 0)
    assert len(seen) == 4 and not torch.equal(seen[0], seen[-1])


def test_feedback_and_the_multiplier_change_what_is_trained(tiny_model):
    def trained(**settings) -> torch.Tensor:
        torch.manual_seed(0)
        adapter = TinyAdapter(tiny_model)
        ema = AdapterEMA(adapter.trainable_parameters(), decay=0.9, **settings)
        run = make_run(tiny_model, adapter, LoopSettings(total_steps=3, save_every=100),
                       batches(tiny_model), [])
        run.after_update = ema.update
        train(run, 0)
        return adapter.delta.detach().clone()

    off = trained()
    assert not torch.allclose(trained(feedback=True), off)
    assert not torch.allclose(trained(param_multiplier=0.5), off)
    assert torch.equal(trained(feedback=False, param_multiplier=1.0), off)


def test_a_job_with_feedback_trains_other_weights(tmp_path: Path, example_model_dir: Path):
    """The config's switches reach the job's average: the trained weights differ from a
    run without them (and neither key warns)."""
    def trained(name: str, **switches: object) -> dict[str, torch.Tensor]:
        cfg = job_config(name, tmp_path / "out", example_model_dir, steps=2,
                         train={"ema_config": {"use_ema": True, "ema_decay": 0.5,
                                               **switches}},
                         save={"save_every": 2, "dtype": "float32"},
                         sample={"sample_every": 100, "prompts": []})
        loaded = load_config(str(write_config(tmp_path / f"{name}.yml", cfg)))
        assert loaded.warnings == []
        assert run_job(loaded) == EXIT_OK
        return load_file(tmp_path / "out" / name / "checkpoints" / "step_000000002" /
                         "adapter.safetensors")

    plain = trained("plain")
    fed = trained("fed", use_feedback=True, param_multiplier=0.99)
    assert plain.keys() == fed.keys()
    assert any(not torch.allclose(plain[k], fed[k]) for k in plain)
