"""Ctrl+C on a real `python run.py` process: the step finishes, a checkpoint is saved,
exit 130; resuming gives exactly the weights of an uninterrupted run. A second Ctrl+C
stops at once and still corrupts nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aitk import checkpoint as ckpt
from tests.aitk.aitk_testing import REPO, job_config, run_py, write_config

STEPS = 20
# Everything random in a step: caption dropout, LoRA dropout (global RNG), noise and
# timesteps, the data order across epochs, accumulation, and previews in between.
OVERRIDES = dict(
    network={"type": "lora", "linear": 4, "linear_alpha": 4, "dropout": 0.1},
    datasets=[{"folder_path": str(REPO / "datasets" / "example"), "resolution": [32, 48],
               "caption_dropout_rate": 0.3, "cache_latents_to_disk": True}],
    train={"gradient_accumulation": 2, "lr_scheduler": "cosine",
           "lr_scheduler_params": {"warmup_steps": 3}},
    save={"save_every": 5, "max_step_saves_to_keep": 2},
    sample={"sample_every": 4},
)


def config(tmp_path: Path, model_dir: Path, name: str) -> Path:
    cfg = job_config(name, tmp_path / "out", model_dir, steps=STEPS, **OVERRIDES)
    return write_config(tmp_path / f"{name}.yml", cfg)


def start(path: Path, tmp_path: Path) -> subprocess.Popen:
    # Lower priority than the test, so the test's signal lands well before the end.
    return subprocess.Popen([sys.executable, str(REPO / "run.py"), str(path)], cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: os.nice(10))


def wait_for_steps(log: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"run ended early ({proc.returncode}):\n{proc.stdout.read()}")
        time.sleep(0.01)
    pytest.fail("no progress")


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, example_model_dir: Path) -> dict[str, torch.Tensor]:
    tmp = tmp_path_factory.mktemp("straight")
    done = run_py(str(config(tmp, example_model_dir, "run")), cwd=tmp)
    assert done.returncode == 0, done.stderr
    return weights(tmp / "out" / "run" / "run.safetensors")


def test_ctrl_c_saves_at_a_step_boundary_and_resume_is_exact(tmp_path: Path,
                                                             example_model_dir: Path,
                                                             straight):
    path = config(tmp_path, example_model_dir, "run")
    out = tmp_path / "out" / "run"
    proc = start(path, tmp_path)
    wait_for_steps(out / "loss_log.jsonl", 2, proc)
    running = json.loads((REPO / ".aitk-run" / f"{proc.pid}.json").read_text())
    assert running["pid"] == proc.pid and running["name"] == "run"
    assert running["config"] == str(path)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, output
    assert "stopping after this step" in output and "Traceback" not in output
    assert not (REPO / ".aitk-run" / f"{proc.pid}.json").exists()

    stopped_at = len((out / "loss_log.jsonl").read_text().splitlines())
    assert 2 <= stopped_at < STEPS
    saved = ckpt.find_resumable(out / "checkpoints", report=pytest.fail)
    assert saved is not None and saved.step == stopped_at  # nothing lost, nothing re-run
    assert (out / f"run_{stopped_at:09d}.safetensors").exists()

    done = run_py(str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"resuming run from step {stopped_at}" in done.stderr
    assert max_diff(weights(out / "run.safetensors"), straight) <= 1e-6
    steps = [json.loads(x)["step"] for x in (out / "loss_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


def test_second_ctrl_c_stops_at_once_without_corrupting(tmp_path: Path,
                                                        example_model_dir: Path, straight):
    path = config(tmp_path, example_model_dir, "run")
    out = tmp_path / "out" / "run"
    proc = start(path, tmp_path)
    wait_for_steps(out / "loss_log.jsonl", 3, proc)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, output
    # Whatever the second signal cut short, every published checkpoint is whole.
    for path_ in (out / "checkpoints").glob("step_*"):
        ckpt.validate(path_)
    done = run_py(str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert max_diff(weights(out / "run.safetensors"), straight) <= 1e-6
