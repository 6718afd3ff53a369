"""Jobs as real `run.py` children (tests/aitk/paused_run.py: a run.py that pauses at a
chosen step until a signal arrives, so no test races the trainer's speed)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from starlette.testclient import TestClient

from aitk_common.status import Phase, Status
from aitk_server.app import create_app
from aitk_server.reconcile import ended
from tests.aitk_server.conftest import (
    REPO,
    kill_hard,
    no_pause,
    pause_at,
    tool_client,
    wait_marker,
    wait_state,
)


def new_job(client: TestClient, text: str) -> int:
    r = client.post("/api/jobs", json={"yaml": text})
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.mark.slow
def test_killed_then_stopped_then_resumed_to_the_end(client, job_yaml, settings,
                                                     monkeypatch):
    """One job through every way a run ends: SIGKILL (failed, resumable), stop (the
    trainer saves, 130), resume to the end; then its outputs through the API."""
    markers = settings.data_dir.parent / "markers"
    job_id = new_job(client, job_yaml("cycle", steps=4))
    pause_at(monkeypatch, 3)  # mid-step 3: steps 1-2 done, a save and samples written
    assert client.post(f"/api/jobs/{job_id}/start", json={}).json()["state"] == "running"
    wait_marker(markers)
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["state"] == "running" and job["progress"]["phase"] == "training"
    assert job["progress"]["total_steps"] == 4
    kill_hard(_pid(settings, job_id))
    job = wait_state(client, job_id, "failed", "finished", "stopped")
    assert job["state"] == "failed" and "SIGKILL" in job["error"], job
    assert job["exit_code"] == 137

    (markers / "step").unlink()
    pause_at(monkeypatch, 1)  # resumed from step 2: pause in step 3 again
    assert client.post(f"/api/jobs/{job_id}/resume", json={}).json()["state"] == "running"
    wait_marker(markers)
    assert client.post(f"/api/jobs/{job_id}/stop", json={}).json()["state"] == "stopping"
    job = wait_state(client, job_id, "stopped", "failed")
    assert (job["state"], job["exit_code"]) == ("stopped", 130), job
    assert [f["step"] for f in client.get(f"/api/jobs/{job_id}/loras").json()] == [2, 3]

    no_pause(monkeypatch)
    assert client.post(f"/api/jobs/{job_id}/resume", json={}).json()["state"] == "running"
    job = wait_state(client, job_id, "finished", "failed")
    assert (job["state"], job["exit_code"], job["progress"]["step"]) == ("finished", 0, 4)
    assert [e["event"] for e in job["history"]][-1] == "finished (exit 0)"
    loss = client.get(f"/api/jobs/{job_id}/loss").json()
    assert [p[0] for p in loss] == [1, 2, 3, 4]  # each step once across the resumes
    steps = [s["step"] for s in client.get(f"/api/jobs/{job_id}/samples").json()]
    assert steps[0] == 0 and 4 in steps
    final = [f for f in client.get(f"/api/jobs/{job_id}/loras").json() if f["final"]]
    assert final[0]["file"] == "cycle.safetensors"
    lora = client.get(f"/api/jobs/{job_id}/files/cycle.safetensors?download=1")
    assert lora.status_code == 200 and len(lora.content) == final[0]["size"]
    log = client.get(f"/api/jobs/{job_id}/log").json()["log"]
    assert "resuming cycle from step 2" in log and "resuming cycle from step 3" in log


@pytest.mark.slow
def test_a_restarted_server_reconnects_to_the_running_job(settings, job_yaml, monkeypatch):
    with tool_client(create_app(settings), settings) as first:
        job_id = new_job(first, job_yaml("adopted", steps=3))
        pause_at(monkeypatch, 2)
        first.post(f"/api/jobs/{job_id}/start", json={})
        wait_marker(settings.data_dir.parent / "markers")
    # The first server is gone (its process would be too); the trainer runs on.
    second_app = create_app(settings)
    with tool_client(second_app, settings) as second:
        job = second.get(f"/api/jobs/{job_id}").json()
        assert job["state"] == "running" and job["progress"]["phase"] == "training"
        assert second.post(f"/api/jobs/{job_id}/stop", json={}).json()["state"] == "stopping"
        job = wait_state(second, job_id, "stopped", "failed")
        # Not this server's child: how it ended comes from the trainer's status file.
        assert (job["state"], job["exit_code"]) == ("stopped", 130), job


@pytest.mark.slow
def test_queued_jobs_run_one_after_another_past_a_refused_config(client, job_yaml,
                                                                  monkeypatch, tmp_path):
    """A config the trainer's check refuses is not accepted at all (its problem at the
    field); one that becomes unusable after it was accepted (its dataset folder deleted)
    fails at its start with the problem at the field, and the queue moves on."""
    no_pause(monkeypatch)
    refused = client.post("/api/jobs", json={"yaml": job_yaml("q0", steps=1).replace(
        "arch: example", "arch: nosuch")})
    assert refused.status_code == 422
    assert [e["path"] for e in refused.json()["errors"]] == ["config.process[0].model.arch"]
    gone = tmp_path / "gone"
    shutil.copytree(REPO / "datasets" / "example", gone)
    bad = new_job(client, job_yaml("q1", steps=1).replace(
        str(REPO / "datasets" / "example"), str(gone)))
    shutil.rmtree(gone)
    good = new_job(client, job_yaml("q2", steps=1))
    states = [j["state"] for j in client.post("/api/queue", json={"ids": [bad, good]}).json()]
    assert states == ["running", "queued"]
    wait_state(client, good, "finished", "failed")
    jobs = {j["id"]: j for j in client.get("/api/jobs").json()}
    assert (jobs[bad]["state"], jobs[bad]["exit_code"]) == ("failed", 2)
    assert [e["path"] for e in jobs[bad]["errors"]] == \
        ["config.process[0].datasets[0].folder_path"]
    assert jobs[good]["state"] == "finished"
    assert jobs[bad]["ended"] <= jobs[good]["started"]


def _pid(settings, job_id: int) -> int:
    status = settings.data_dir / "jobs" / str(job_id) / "status.json"
    return json.loads(status.read_text())["pid"]


def test_how_a_job_ended_when_its_process_is_gone():
    final = Status(pid=7, phase=Phase.STOPPED, exit_code=130)
    assert ended(7, None, final).state == "stopped"
    assert ended(7, None, replace(final, pid=8)).state == "failed"  # another run's file
    assert ended(7, None, Status(pid=7, phase=Phase.TRAINING)).state == "failed"
    killed = ended(7, -9, Status(pid=7, phase=Phase.TRAINING))
    assert (killed.state, killed.exit_code) == ("failed", 137) and "SIGKILL" in killed.error
    assert ended(7, 0, None).state == "finished" and ended(7, 130, None).state == "stopped"
