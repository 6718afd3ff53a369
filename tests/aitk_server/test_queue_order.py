"""Reordering the queue (POST /api/queue/order): the runner starts the next job by the
new order. The trainer is a stand-in that notes its start and waits for its cue, so no
test here runs run.py or races a process's speed; jobs are rows made in the database
(no preflight)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from aitk_server.app import Settings, create_app
from aitk_server.db import Database
from aitk_server.runner import Runner, reordered
from tests.aitk_server.conftest import tool_client, wait_for

# Notes its job's id (its config lives in jobs/<id>/) and exits 0 when told to.
STAND_IN = """import os, sys, time
from pathlib import Path
job = Path(sys.argv[-1]).parent.name
cues = Path(os.environ["AITK_TEST_MARKERS"])
with open(cues / "started", "a") as f:
    f.write(job + "\\n")
while not (cues / f"end-{job}").exists():
    time.sleep(0.02)
"""


def test_reordered_puts_the_named_jobs_first_and_reuses_the_places():
    queue = [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0)]
    assert reordered(queue, [3, 1]) == {3: 10.0, 1: 20.0, 2: 30.0}
    assert reordered(queue, []) == {}
    assert reordered(queue, [1, 2]) == {}  # already so: nothing written
    assert reordered(queue, [4, 3, 2, 1]) == {4: 10.0, 3: 20.0, 2: 30.0, 1: 40.0}
    tied = reordered([(1, 5.0), (2, 5.0)], [2])  # queued in the same instant
    assert list(tied) == [1] and tied[1] > 5.0  # 2 keeps 5.0, 1 goes after
    for bad in ([1, 1], [9]):
        with pytest.raises(ValueError):
            reordered(queue, bad)


@pytest.fixture
def cues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cues"
    where.mkdir()
    monkeypatch.setenv("AITK_TEST_MARKERS", str(where))
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    return where


def started(cues: Path) -> list[int]:
    path = cues / "started"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def end(cues: Path, job_id: int) -> None:
    (cues / f"end-{job_id}").write_text("")


def test_the_runner_starts_the_next_job_by_the_new_order(tmp_path, cues):
    db = Database(tmp_path / "jobs.sqlite")
    runner = Runner(db, tmp_path / "data", tmp_path, python=sys.executable,
                    trainer=tmp_path / "stand_in.py")
    a, b, c, d = (db.create(n, "config: stand-in", str(tmp_path / n)).id
                  for n in "abcd")
    try:
        runner.start(a)
        for job_id in (b, c, d):
            assert runner.enqueue(job_id).state == "queued"
        assert [j.id for j in runner.reorder([d, b])] == [d, b, c]
        assert "moved in the queue" in [e["event"] for e in db.history(d)]
        for running, after in ((a, [a, d]), (d, [a, d, b]), (b, [a, d, b, c])):
            wait_for(lambda: {"started": started(cues)}, lambda v: a in v["started"],
                     "the first job to start")
            end(cues, running)
            wait_for(lambda: (runner.reconcile(), {"started": started(cues)})[1],
                     lambda v, after=after: v["started"] == after, f"{after} to start")
        end(cues, c)
        wait_for(lambda: (runner.reconcile(), {"s": db.get(c).state})[1],
                 lambda v: v["s"] == "finished", "the last job to end")
    finally:
        for job_id in (a, b, c, d):
            end(cues, job_id)
        runner.stop_all(30)


@pytest.fixture
def app_client(settings: Settings, tmp_path: Path, cues: Path) -> Iterator[TestClient]:
    app = create_app(replace(settings, trainer=tmp_path / "stand_in.py"))
    with tool_client(app, settings) as client:
        yield client
    for job in app.state.api.db.all():
        end(cues, job.id)
    app.state.api.runner.stop_all(30)


def test_the_order_route_refuses_unknown_and_unqueued_jobs(app_client, cues, tmp_path):
    db: Database = app_client.app.state.api.db  # type: ignore[attr-defined]
    ids = [db.create(n, "config: stand-in", str(tmp_path / n)).id for n in "abcd"]
    a, b, c, d = ids
    queued = app_client.post("/api/queue", json={"ids": ids}).json()
    assert [(j["state"], j["queue_place"]) for j in queued] == [
        ("running", None), ("queued", 1), ("queued", 2), ("queued", 3)]
    r = app_client.post("/api/queue/order", json={"ids": [c, d]})
    assert r.status_code == 200, r.text
    assert [(j["id"], j["queue_place"]) for j in r.json()] == [(c, 1), (d, 2), (b, 3)]
    listed = {j["id"]: j["queue_place"] for j in app_client.get("/api/jobs").json()}
    assert listed == {a: None, b: 3, c: 1, d: 2}

    bad = [
        (404, "no such job: 999", {"ids": [c, 999]}),
        (409, "a is running, not queued", {"ids": [a, c]}),
        (400, "each job once", {"ids": [c, c]}),
        (400, '{"ids"', {"ids": [str(c)]}),
        (400, '{"ids"', {"ids": [True]}),
        (400, '{"ids"', {"ids": c}),
        (400, '{"ids"', {}),
        (400, '{"ids"', {"ids": list(range(1, 10_002))}),
        (404, "no such job", {"ids": [10**30]}),
    ]
    for code, words, body in bad:
        r = app_client.post("/api/queue/order", json=body)
        assert r.status_code == code and words in r.json()["error"], (body, r.text)
        assert "\n" not in r.json()["error"]
    r = app_client.post("/api/queue/order", content=b"[" * 100_000,
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "\n" not in r.json()["error"]
    r = app_client.post("/api/queue/order", content=b" " * (2 * 2**20),
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    # None of that moved anything.
    listed = {j["id"]: j["queue_place"] for j in app_client.get("/api/jobs").json()}
    assert listed == {a: None, b: 3, c: 1, d: 2}
