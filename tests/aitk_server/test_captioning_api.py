"""Captioning from the dataset page: a `python -m aitk caption` child per run with a
tiny random VLM built locally, progress read back, existing captions kept, one run per
dataset at a time, every input error one line."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.aitk_server.conftest import REPO, WAIT_S


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aitk.caption.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny vlm")


def test_bad_requests_are_one_line(client):
    client.post("/api/datasets", json={"name": "cats"})
    assert client.post("/api/datasets/cats/caption", json={}).status_code == 400
    assert client.post("/api/datasets/dogs/caption", json={"model": "m"}).status_code == 404
    assert client.post("/api/datasets/cats/caption",
                       json={"model": "m", "trigger": 3}).status_code == 400
    assert client.post("/api/captioning/99/stop", json={}).status_code == 404
    assert client.get("/api/captioning").json() == []


@pytest.mark.slow  # a captioning child process with a model
def test_caption_a_dataset_with_a_tiny_vlm(client, settings, tiny_vlm):
    folder = settings.datasets_dir / "cats"
    folder.mkdir()
    pictures = sorted((REPO / "datasets" / "example").glob("*.png"))[:2]
    for p in pictures:
        shutil.copy(p, folder / p.name)
    (folder / pictures[0].name).with_suffix(".txt").write_text("mine")
    run = client.post("/api/datasets/cats/caption",
                      json={"model": str(tiny_vlm), "trigger": "p1xel"})
    assert run.status_code == 202, run.text
    again = client.post("/api/datasets/cats/caption", json={"model": str(tiny_vlm)})
    assert again.status_code == 409
    deadline = time.monotonic() + WAIT_S
    while (shown := client.get("/api/captioning").json()[0])["running"]:
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)
    assert (shown["phase"], shown["done"], shown["total"], shown["exit_code"]) == (
        "finished", 1, 1, 0), shown
    assert (folder / pictures[1].name).with_suffix(".txt").read_text().startswith("p1xel")
    assert (folder / pictures[0].name).with_suffix(".txt").read_text() == "mine"
    assert client.get("/api/datasets/cats/audit").json()["missing_captions"] == []
