"""Honest progress (a phase from the first second, speed and ETA only while training)
and "save now" / "sample now" left for the trainer's next step boundary."""

from __future__ import annotations

import pytest

from aitk_common import requests
from aitk_common.requests import Request
from aitk_server.app import honest_progress
from tests.aitk_server.conftest import pause_at, wait_marker, wait_state


def test_a_started_job_says_starting_before_the_trainer_writes_a_word():
    shown = honest_progress({}, active=True)
    assert shown["phase"] == "starting" and shown["phase_text"] == "starting the trainer"


def test_speed_and_eta_show_only_while_training():
    live = {"phase": "training", "step": 5, "total_steps": 10, "it_per_s": 2.0,
            "eta_s": 2.5}
    assert honest_progress(live, active=True)["eta_s"] == 2.5
    sampling = honest_progress({**live, "phase": "sampling"}, active=True)
    assert sampling["it_per_s"] is None and sampling["phase_text"] == "making previews"
    done = honest_progress({**live, "phase": "finished", "step": 10}, active=False)
    assert (done["it_per_s"], done["eta_s"], done["phase"]) == (None, None, "finished")
    stale = honest_progress({**live, "phase": "caching"}, active=False)
    assert stale["phase"] is None and stale["it_per_s"] is None


@pytest.mark.slow
def test_save_now_and_sample_now_need_a_running_job_and_leave_a_request(
        client, job_yaml, settings, monkeypatch):
    job = client.post("/api/jobs", json={"yaml": job_yaml("asked")}).json()
    assert client.post(f"/api/jobs/{job['id']}/ask", json={"what": "save"}).status_code \
        == 409
    api = client.app.state.api
    pause_at(monkeypatch, 2)  # the trainer waits mid-step 2: running, for sure
    client.post(f"/api/jobs/{job['id']}/start", json={})
    wait_marker(settings.data_dir.parent / "markers")
    for what in ("save", "sample", "sample"):
        answer = client.post(f"/api/jobs/{job['id']}/ask", json={"what": what})
        assert answer.status_code == 200, answer.text
    assert answer.json()["asked"] == ["sample", "save"]
    assert "save_now" in answer.json()["actions"]
    folder = api.runner.requests_dir(job["id"])
    assert requests.take(folder) == {Request.SAVE, Request.SAMPLE}
    assert client.post(f"/api/jobs/{job['id']}/ask", json={"what": "rm"}).status_code == 400
    client.post(f"/api/jobs/{job['id']}/stop", json={})
    wait_state(client, job["id"], "stopped", "failed")


def test_the_trainer_is_told_where_its_requests_wait(settings, tmp_path, monkeypatch):
    """The runner names the folder in the trainer's environment, and a new run never
    takes what was asked of the last one."""
    import subprocess

    from aitk_server.db import Database
    from aitk_server.runner import Runner

    seen: dict = {}

    def fake_popen(argv, env, **kwargs):
        seen.update(env)
        raise OSError("not started in this test")

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    db = Database(tmp_path / "jobs.sqlite")
    runner = Runner(db, tmp_path / "data", settings.root)
    job = db.create("j", "config: {}", str(tmp_path / "out"))
    requests.ask(runner.requests_dir(job.id), Request.SAVE)
    runner.start(job.id)
    assert seen[requests.ENV_VAR] == str(runner.requests_dir(job.id))
    assert requests.pending(runner.requests_dir(job.id)) == frozenset()
