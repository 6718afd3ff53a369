"""status.json: the format the trainer writes and the web UI's server reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aitk_common.status import (
    Phase,
    Problem,
    Status,
    StatusFormatError,
    final_phase,
    read_status,
    write_status,
)

# The server reads these names (aitk_server/runner.py, reconcile.py, app.py): they stay.
FIELDS = {"schema_version", "pid", "name", "phase", "step", "total_steps", "loss",
          "it_per_s", "eta_s", "message", "exit_code", "error", "errors", "started",
          "updated", "val_loss", "best_val_step", "best_val_loss"}


def test_the_file_keeps_its_field_names_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    status = Status(pid=7, name="n", phase=Phase.FAILED, step=3, total_steps=10,
                    loss=0.5, exit_code=2, error="bad",
                    errors=[Problem("config.process[0].train.steps", "too small")])
    write_status(path, status)
    data = json.loads(path.read_text())
    assert set(data) == FIELDS
    assert data["phase"] == "failed" and data["errors"] == [
        {"path": "config.process[0].train.steps", "message": "too small"}]
    assert read_status(path) == status


def test_phases_are_an_enum_whose_final_ones_say_so() -> None:
    assert [p.value for p in Phase] == ["loading", "caching", "training", "sampling",
                                        "saving", "captioning", "working", "finished", "stopped",
                                        "failed"]
    assert {p for p in Phase if p.final} == {Phase.FINISHED, Phase.STOPPED, Phase.FAILED}
    assert final_phase(0) is Phase.FINISHED and final_phase(130) is Phase.STOPPED
    assert final_phase(2) is Phase.FAILED


@pytest.mark.parametrize("body", [
    "[]", "{torn", json.dumps({"schema_version": 2, "pid": 1, "phase": "loading", "step": 0}),
    json.dumps({"schema_version": 1, "pid": 1, "phase": "dreaming", "step": 0}),
    json.dumps({"schema_version": 1, "pid": "1", "phase": "loading", "step": 0}),
    json.dumps({"schema_version": 1, "pid": 1, "phase": "loading", "step": 0, "loss": "x"}),
])
def test_anything_else_is_a_format_error_and_no_file_is_none(tmp_path: Path,
                                                               body: str) -> None:
    assert read_status(tmp_path / "absent.json") is None
    (tmp_path / "status.json").write_text(body)
    with pytest.raises(StatusFormatError):
        read_status(tmp_path / "status.json")
