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


# ---- runs kept across a restart ---------------------------------------------------------
# A stand-in for `python -m aitk caption`: one picture done of three, then it waits;
# SIGTERM ends it as the CLI does (a final status, exit 130). A shell line starts it, as
# a "#!" line cannot name an interpreter whose path has a space (CI's checkout has one).
STAND_IN = """import os, signal, sys, time
sys.path.insert(0, os.getcwd())
from pathlib import Path
from aitk_common.status import Phase, Status, write_status
path, stop = Path(os.environ["AITK_STATUS_FILE"]), []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
def say(phase, code=None):
    write_status(path, Status(pid=os.getpid(), phase=phase, step=1, total_steps=3,
                              message="a.png", exit_code=code))
say(Phase.CAPTIONING)
while not stop:
    time.sleep(0.02)
say(Phase.STOPPED, 130)
sys.exit(130)
"""


@pytest.fixture
def stand_in_settings(settings, tmp_path):
    import dataclasses
    import shlex
    import sys

    body = tmp_path / "stand_in.py"
    body.write_text(STAND_IN)
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(body))}\n')
    script.chmod(0o755)
    (settings.datasets_dir / "cats").mkdir()
    yield dataclasses.replace(settings, python=str(script))
    # A failed test leaves no captioner behind (each writes its pid in its status).
    from aitk_common import procs
    from aitk_common.status import read_status

    for path in (settings.data_dir / "captioning").glob("*/status.json"):
        found = read_status(path)
        if found is not None and procs.pid_alive(found.pid):
            procs.kill_group(found.pid)


def captioning(client, done) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not done(shown := client.get("/api/captioning").json()[0]):
        assert time.monotonic() < deadline, shown
        time.sleep(0.05)
    return shown


def test_a_run_the_server_died_under_is_interrupted_after_the_restart(stand_in_settings):
    """The server and its captioner both gone (a crash, a reboot): the restarted
    server lists the run with its last progress, ended, never "running"."""
    from aitk_common import procs
    from aitk_server.app import create_app
    from tests.aitk_server.conftest import tool_client

    first = tool_client(create_app(stand_in_settings), stand_in_settings)
    run = first.post("/api/datasets/cats/caption", json={"model": "m"}).json()
    shown = captioning(first, lambda r: r["phase"] == "captioning")
    assert (shown["running"], shown["done"], shown["total"]) == (True, 1, 3)
    child = first.app.state.api.captioning.runs[run["id"]].process
    procs.kill_group(child.pid)  # SIGKILL: no final status
    child.wait()
    del first  # no shutdown: the server died too

    with tool_client(create_app(stand_in_settings), stand_in_settings) as second:
        (shown,) = second.get("/api/captioning").json()
        assert (shown["id"], shown["dataset"], shown["model"]) == (run["id"], "cats", "m")
        assert (shown["running"], shown["phase"], shown["done"], shown["total"]) == (
            False, "interrupted", 1, 3), shown
        assert "server stopped" in shown["error"] and shown["ended"] is not None
        again = second.post("/api/datasets/cats/caption", json={"model": "m"})
        assert again.status_code == 202 and again.json()["id"] == run["id"] + 1
        second.post(f"/api/captioning/{run['id'] + 1}/stop", json={})
        captioning(second, lambda r: not r["running"])


def test_a_run_that_outlived_the_server_is_adopted_and_stops(stand_in_settings):
    """The captioner runs on in its own process group: the restarted server shows it
    running, can stop it, and records how it ended (for the next restart too)."""
    from aitk_server.app import create_app
    from tests.aitk_server.conftest import tool_client

    first = tool_client(create_app(stand_in_settings), stand_in_settings)
    run_id = first.post("/api/datasets/cats/caption", json={"model": "m"}).json()["id"]
    captioning(first, lambda r: r["phase"] == "captioning")
    del first  # the server died; its child did not

    with tool_client(create_app(stand_in_settings), stand_in_settings) as second:
        shown = second.get("/api/captioning").json()[0]
        assert (shown["id"], shown["running"], shown["phase"]) == (run_id, True,
                                                                   "captioning")
        assert second.post("/api/datasets/cats/caption", json={"model": "m"}
                           ).status_code == 409  # still one run per dataset
        second.post(f"/api/captioning/{run_id}/stop", json={})
        shown = captioning(second, lambda r: not r["running"])
        assert (shown["phase"], shown["exit_code"], shown["error"]) == ("stopped", 130,
                                                                        None)
    with tool_client(create_app(stand_in_settings), stand_in_settings) as third:
        assert third.get("/api/captioning").json() == [shown]


def test_how_a_recorded_run_ended_and_damaged_records(tmp_path):
    from aitk_common.procs import ProcessIdentity
    from aitk_common.status import Phase, Status
    from aitk_server.captions import INTERRUPTED, Captioning, Run, settled

    run = Run(1, "cats", tmp_path, "m", 0.0, ProcessIdentity(7, "t"))
    assert settled(run, True, None, None) is None  # alive: not ended
    assert settled(run, False, -9, None) == (-9, None)  # our child: its return code
    stopped = Status(pid=7, phase=Phase.STOPPED, exit_code=130)
    assert settled(run, False, None, stopped) == (130, None)
    assert settled(run, False, None, Status(pid=8, phase=Phase.FINISHED, exit_code=0)
                   ) == (None, INTERRUPTED)  # another process's status
    assert settled(run, False, None, Status(pid=7, phase=Phase.CAPTIONING)) == (
        None, INTERRUPTED)

    base = tmp_path / "data" / "captioning"
    for name, text in (("3", "{not json"), ("5", '{"schema_version": 99}'),
                       ("6", '[1]'), ("x", "{}")):
        (base / name).mkdir(parents=True)
        (base / name / "run.json").write_text(text)
    kept = Captioning(tmp_path / "data", tmp_path, "python")
    assert kept.all() == [] and kept.next_id == 7  # never an old run's folder
