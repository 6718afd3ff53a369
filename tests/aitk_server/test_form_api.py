"""The job form's routes: the fields and the model picker, form edits made in the YAML
(comments kept), and the trainer's full preflight (`run.py --check`) on every create,
edit and "run again", with each problem at its field."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from aitk.models import catalog

# Each job it makes runs the trainer's own `run.py --check` in a child process: the
# trainer-process tier (docs/testing.md).
pytestmark = pytest.mark.slow

DEVICE = "config.process[0].device"
OPTIMIZER = "config.process[0].train.optimizer"


def test_the_form_lists_every_registered_arch_with_its_defaults(client):
    spec = client.get("/api/form").json()
    archs = {a["name"]: a for a in spec["archs"]}
    assert list(archs) == [d.name for d in catalog.descriptions()]
    example = archs["example"]
    assert example["defaults_at"]["config.process[0].train.steps"] == \
        catalog.description("example").defaults.steps
    paths = {f["path"] for f in spec["fields"]}
    assert {"config.process[0].train.steps", "config.process[0].network.linear",
            "config.process[0].datasets[*].folder_path"} <= paths


def test_a_form_edit_changes_its_field_and_keeps_the_comments(client, job_yaml):
    text = "# my job\n" + job_yaml("formed").replace("steps: 4", "steps: 4  # short")
    answer = client.post("/api/form", json={"yaml": text, "edits": [
        {"path": "config.process[0].train.steps", "value": 9},
        {"path": "config.process[0].network.linear", "value": 8}]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert "# my job" in body["yaml"] and "# short" in body["yaml"]
    assert body["values"]["config.process[0].train.steps"] == 9
    assert body["values"]["config.process[0].network.linear"] == 8
    assert yaml.safe_load(body["yaml"])["config"]["process"][0]["train"]["steps"] == 9


def test_a_bad_form_edit_or_bad_yaml_is_one_line(client, job_yaml):
    bad = client.post("/api/form", json={"yaml": job_yaml(), "edits": [
        {"path": "config.process[9].train.steps", "value": 1}]})
    assert bad.status_code == 422 and "process[9]" in bad.json()["errors"][0]["message"]
    broken = client.post("/api/form", json={"yaml": "a: [", "edits": []})
    assert broken.status_code == 422 and broken.json()["errors"][0]["path"] == ""


def unstartable(text: str) -> str:
    data = yaml.safe_load(text)
    proc = data["config"]["process"][0]
    proc["device"] = "cuda:99"  # no machine has it: refused with or without CUDA
    proc["train"]["optimizer"] = "adamw8bit"
    return yaml.safe_dump(data)


def test_a_config_the_trainer_would_refuse_is_not_accepted(client, job_yaml):
    answer = client.post("/api/jobs", json={"yaml": unstartable(job_yaml("nostart"))})
    assert answer.status_code == 422, answer.text
    at = {e["path"] for e in answer.json()["errors"]}
    assert DEVICE in at, answer.text
    if importlib.util.find_spec("bitsandbytes") is None:
        assert OPTIMIZER in at
    assert client.get("/api/jobs").json() == []


def test_check_says_what_a_create_would_without_making_a_job(client, job_yaml):
    good = client.post("/api/check", json={"yaml": job_yaml("checked")}).json()
    assert good["ok"] is True and good["errors"] == []
    bad = client.post("/api/check", json={"yaml": unstartable(job_yaml("checked"))}).json()
    assert bad["ok"] is False and DEVICE in {e["path"] for e in bad["errors"]}
    schema = client.post("/api/check", json={"yaml": job_yaml().replace(
        "steps: 4", "steps: -1")}).json()
    assert schema["ok"] is False
    assert "config.process[0].train.steps" in {e["path"] for e in schema["errors"]}
    assert client.get("/api/jobs").json() == []


def test_editing_a_job_runs_the_preflight_too(client, job_yaml):
    made = client.post("/api/jobs", json={"yaml": job_yaml("edited")})
    assert made.status_code == 201, made.text
    job = made.json()
    refused = client.put(f"/api/jobs/{job['id']}/config",
                         json={"yaml": unstartable(job_yaml("edited"))})
    assert refused.status_code == 422
    assert DEVICE in {e["path"] for e in refused.json()["errors"]}
    assert client.get(f"/api/jobs/{job['id']}").json()["config_yaml"] == job_yaml("edited")


def test_run_again_under_a_new_name_keeps_the_config_and_its_comments(client, job_yaml):
    text = job_yaml("first").replace("steps: 4", "steps: 4  # kept")
    first = client.post("/api/jobs", json={"yaml": text}).json()
    again = client.post(f"/api/jobs/{first['id']}/copy", json={"name": "second"})
    assert again.status_code == 201, again.text
    second = again.json()
    assert second["name"] == "second" and second["id"] != first["id"]
    assert "# kept" in second["config_yaml"]
    assert second["out_dir"].endswith("second")
    taken = client.post(f"/api/jobs/{first['id']}/copy", json={"name": "second"})
    assert taken.status_code == 422
    assert taken.json()["errors"][0]["path"] == "config.name"
