"""What the server reads from the trainer's `run.py --check --json` (one object per
run): its error problems at their fields, whether the trainer gave a field path or,
for a config that does not load, one "path: message" line."""

from __future__ import annotations

import json

from aitk_server.preflight import json_objects, memory_from, problems_from


def test_error_problems_come_with_their_field_and_fix() -> None:
    run = {"ok": False, "problems": [
        {"level": "error", "path": "config.process[0].device", "message": "no CUDA",
         "fix": "set `device: cpu`", "code": "device"},
        {"level": "warning", "path": "config.process[0].train.lr", "message": "high"}],
        "memory": {"fits": True}}
    assert problems_from(json_objects(json.dumps(run))) == [
        {"path": "config.process[0].device", "message": "no CUDA (set `device: cpu`)"}]
    assert memory_from(json_objects(json.dumps(run))) == {"fits": True}


def test_a_config_that_does_not_load_is_split_at_its_path() -> None:
    lines = "\n".join(json.dumps({"ok": False, "problems": [
        {"level": "error", "message": f"config.process[{i}].model.arch: unknown arch"}]})
        for i in range(2))
    assert problems_from(json_objects(lines)) == [
        {"path": f"config.process[{i}].model.arch", "message": "unknown arch"}
        for i in range(2)]
    assert problems_from(json_objects("not json")) == []
