"""Fixtures for the web UI server tests: a tiny example model built once, short job
configs, and the app over a private data folder (never the checkout's .aitk-ui/)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from starlette.testclient import TestClient

from aitk_server.app import Settings, create_app

REPO = Path(__file__).resolve().parents[2]
PAUSED_RUN = REPO / "tests" / "aitk" / "paused_run.py"
WAIT_S = 300  # only a broken test waits this long: progress is polled, never timed


@pytest.fixture(scope="session")
def example_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aitk.models.example.build import build_example_model

    return build_example_model(tmp_path_factory.mktemp("model") / "example")


def short_job(name: str, out: Path, model: Path, steps: int = 4) -> dict:
    """The example job cut down: 32 px, a few steps, one 2-step preview per save."""
    return {"job": "extension", "config": {"name": name, "process": [{
        "type": "sd_trainer", "training_folder": str(out), "device": "cpu",
        "trigger_word": "p1xel", "network": {"type": "lora", "linear": 4, "linear_alpha": 4},
        "save": {"dtype": "float32", "save_every": 2, "max_step_saves_to_keep": 2},
        "datasets": [{"folder_path": str(REPO / "datasets" / "example"), "resolution": [32]}],
        "train": {"batch_size": 1, "steps": steps, "lr": 1e-3, "optimizer": "adamw",
                  "gradient_checkpointing": False, "seed": 3},
        "model": {"arch": "example", "name_or_path": str(model)},
        "sample": {"sample_every": 2, "width": 32, "height": 32, "sample_steps": 2,
                   "prompts": ["[trigger] a red circle"], "format": "png"}}]},
        "meta": {"name": "[name]", "version": "1.0"}}


@pytest.fixture
def job_yaml(tmp_path: Path, example_model: Path) -> Callable[..., str]:
    def make(name: str = "demo", steps: int = 4) -> str:
        return yaml.safe_dump(short_job(name, tmp_path / "out", example_model, steps))

    return make


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("AITK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AITK_TEST_MARKERS", str(tmp_path / "markers"))
    (tmp_path / "markers").mkdir()
    (tmp_path / "datasets").mkdir()
    (tmp_path / "examples").mkdir()
    return Settings.for_checkout(REPO, data_dir=tmp_path / "ui-data",
                                 datasets_dir=tmp_path / "datasets",
                                 examples_dir=tmp_path / "examples",
                                 ui_dir=tmp_path / "no-ui", trainer=PAUSED_RUN,
                                 monitor_interval_s=0.2)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def wait_for(get: Callable[[], dict], done: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        value = get()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT_S}s for {what}; last: {json.dumps(value)}")
        time.sleep(0.1)


def wait_state(client: TestClient, job_id: int, *states: str) -> dict:
    return wait_for(lambda: client.get(f"/api/jobs/{job_id}").json(),
                    lambda j: j["state"] in states, f"job {job_id} to be {states}")


def wait_marker(markers: Path, point: str = "step") -> None:
    wait_for(lambda: {"exists": (markers / point).exists()}, lambda v: v["exists"],
             f"the paused run to reach {point}")


def pause_at(monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    """The next started trainer pauses in its Nth loss computation until a signal."""
    monkeypatch.setenv("AITK_TEST_PAUSE_CALL", str(call))


def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AITK_TEST_PAUSE_CALL", raising=False)


def kill_hard(pid: int) -> None:
    import signal

    os.killpg(pid, signal.SIGKILL)
