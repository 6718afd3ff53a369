"""Fixtures for the web UI server tests: the session's tiny example model, short job
configs, and the app over a private data folder (never the checkout's .aitk-ui/).

`client` calls the app as this user's own tools do: on the server's own Host, with the
secret as a bearer token (the guard's attack tests are in test_guard.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from safetensors.numpy import save_file
from starlette.testclient import TestClient

import aitk
from aitk.run.ownership import image_mark
from aitk_server.app import Settings, create_app

REPO = Path(__file__).resolve().parents[2]
PAUSED_RUN = REPO / "tests" / "aitk" / "paused_run.py"
WAIT_S = 300  # only a broken test waits this long: progress is polled, never timed
SECRET = "test-secret-of-this-start"


@pytest.fixture(scope="session")
def example_model(example_model_dir: Path) -> Path:
    """The session's one tiny example model (tests/conftest.py), by this folder's name."""
    return example_model_dir


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
                                 ui_dir=tmp_path / "no-ui", outputs_dir=tmp_path / "out",
                                 trainer=PAUSED_RUN, monitor_interval_s=0.2, secret=SECRET)


def free_socket() -> socket.socket:
    """A listening socket on an ephemeral 127.0.0.1 port (its port goes into Settings
    before the app is made: the guard's Host allow-list needs it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@contextlib.contextmanager
def uvicorn_serving(app: object, sock: socket.socket) -> Iterator[str]:
    """A real uvicorn serving `app` on `sock`, in a thread of this process (so a test
    can reach into the app); yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",  # type: ignore[arg-type]
                                           timeout_graceful_shutdown=1))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        app.state.api.runner.stop_all(60)  # type: ignore[attr-defined]


def tool_client(app: object, settings: Settings) -> TestClient:
    """A client as a local tool holding the secret file calls the API."""
    return TestClient(app, base_url=f"http://127.0.0.1:{settings.port}",  # type: ignore[arg-type]
                      headers={"Authorization": f"Bearer {settings.secret}"})


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with tool_client(create_app(settings), settings) as c:
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


def aitk_png(path: Path, shade: int = 0) -> bytes:
    """A preview as the trainer writes it: a PNG carrying aitk's EXIF mark."""
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (shade, 0, 0)).save(buf, format="PNG", exif=image_mark())
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def aitk_lora(path: Path, value: float) -> bytes:
    """A LoRA file as the trainer writes it: safetensors whose metadata names aitk."""
    save_file({"w": np.full(2, value, dtype=np.float32)}, str(path),
              metadata={"software": json.dumps({"name": aitk.SOFTWARE_NAME})})
    return path.read_bytes()


def fake_outputs(out_dir: Path, name: str) -> dict[str, bytes]:
    (out_dir / "samples").mkdir(parents=True)
    written = {
        "samples/000000002_0.png": aitk_png(out_dir / "samples" / "000000002_0.png", 2),
        "samples/000000000_0.png": aitk_png(out_dir / "samples" / "000000000_0.png", 0),
        f"{name}_000000002.safetensors": aitk_lora(out_dir / f"{name}_000000002.safetensors",
                                                   2.0),
        f"{name}.safetensors": aitk_lora(out_dir / f"{name}.safetensors", 1.0)}
    (out_dir / "loss_log.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1 / s, "lr": 1e-3, "time": 0}) + "\n"
                for s in range(1, 11)) + '{"step": 11, "lo')  # a torn last line
    return written
