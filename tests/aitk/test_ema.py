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
