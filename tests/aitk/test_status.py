"""The trainer's status file: phases, totals and errors as data for the web UI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aitk.config.loading import load_config
from aitk.run.job import run_job
from aitk.run.status import StatusFile
from aitk_common.status import final_phase, problem_fields
from tests.aitk.aitk_testing import REPO, job_config, write_config


def test_problem_lines_become_fields():
    assert problem_fields(["config.process[0].train.steps: input should be > 0 (got 0)",
                           "the file must hold a mapping with `job` and `config`"]) == [
        {"path": "config.process[0].train.steps", "message": "input should be > 0 (got 0)"},
        {"path": "", "message": "the file must hold a mapping with `job` and `config`"}]


@pytest.mark.parametrize(("code", "phase"), [(0, "finished"), (130, "stopped"),
                                             (1, "failed"), (2, "failed")])
def test_exit_codes_map_to_final_phases(code, phase):
    assert final_phase(code) == phase


def test_step_updates_are_throttled_but_phases_and_the_last_step_are_written(tmp_path):
    path = tmp_path / "s" / "status.json"
    status = StatusFile(path, "n")
    status.phase("training", total_steps=3)
    status.progress(1, 0.5, 2.0, 1.0)  # within the interval of the phase write
    assert json.loads(path.read_text())["step"] == 0
    status.progress(3, 0.25, 2.0, 0.0)  # the last step is always written
    assert json.loads(path.read_text())["step"] == 3
    status.finish(130)
    data = json.loads(path.read_text())
    assert (data["phase"], data["exit_code"], data["loss"]) == ("stopped", 130, 0.25)
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]  # no temp left


@pytest.mark.slow
def test_a_finished_job_leaves_a_final_status_beside_its_outputs(tmp_path, example_model_dir):
    cfg = job_config("st", tmp_path / "out", example_model_dir, steps=2,
                     sample={"sample_every": 100})
    assert run_job(load_config(str(write_config(tmp_path / "c.yml", cfg)))) == 0
    data = json.loads((tmp_path / "out" / "st" / "status.json").read_text())
    assert data["phase"] == "finished" and data["step"] == data["total_steps"] == 2
    assert data["exit_code"] == 0 and data["loss"] is not None and data["error"] is None


@pytest.mark.slow
def test_a_bad_config_reports_its_problems_field_by_field(tmp_path, example_model_dir):
    cfg = job_config("bad", tmp_path / "out", example_model_dir, train={"steps": 0})
    status = tmp_path / "status.json"
    done = subprocess.run([sys.executable, str(REPO / "run.py"),
                           str(write_config(tmp_path / "c.yml", cfg))],
                          env={**_env(), "AITK_STATUS_FILE": str(status)},
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2
    data = json.loads(status.read_text())
    assert data["phase"] == "failed" and data["exit_code"] == 2
    assert [e["path"] for e in data["errors"]] == ["config.process[0].train.steps"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
