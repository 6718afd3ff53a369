"""The run record and the lock holder: one writer and one reader each, versioned, and
read back by the manager's own reader as the trainer writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from aitk_common import records


def test_a_run_record_round_trips_and_names_its_format(tmp_path: Path) -> None:
    rec = records.RunRecord(1234, "my_lora", "config/my.yaml", "2026-01-02T03:04:05Z")
    path = records.write_run_record(tmp_path, rec)
    assert path == tmp_path / ".aitk-run" / "1234.json"
    assert json.loads(path.read_text())["schema_version"] == records.SCHEMA_VERSION
    assert records.read_run_record(path) == rec
    assert records.run_record_paths(tmp_path) == [path]
    records.remove_run_record(tmp_path, 1234)
    assert records.run_record_paths(tmp_path) == []


def test_a_damaged_or_newer_run_record_still_counts_by_its_pid(tmp_path: Path) -> None:
    folder = tmp_path / ".aitk-run"
    folder.mkdir()
    (folder / "11.json").write_text("{torn")
    (folder / "12.json").write_text(json.dumps({"schema_version": 99, "pid": 12, "x": 1}))
    (folder / "notes.json").write_text("{}")  # not a record's name
    assert [records.read_run_record(p) for p in records.run_record_paths(tmp_path)] == [
        records.RunRecord(11), records.RunRecord(12)]
    assert records.read_run_record(folder / "notes.json") is None


def test_the_manager_reads_the_run_record_the_trainer_writes(tmp_path: Path) -> None:
    from manager.running_jobs import read_record

    path = records.write_run_record(tmp_path, records.RunRecord(
        os.getpid(), "job", "c.yml", records.utc_now()))
    job = read_record(path)
    assert job is not None and (job.pid, job.name, job.run.config) == (os.getpid(), "job", "c.yml")


def test_the_lock_holder_round_trips_and_anything_else_is_unknown(tmp_path: Path) -> None:
    assert records.read_lock_holder(tmp_path) is None
    holder = records.LockHolder(42, "c.yml", "2026-01-02T03:04:05Z")
    records.write_lock_holder(tmp_path, holder)
    assert records.read_lock_holder(tmp_path) == holder
    assert holder.describe() == "pid 42, started 2026-01-02T03:04:05Z, config c.yml"
    records.holder_path(tmp_path).write_text(json.dumps({"pid": "42"}))
    assert records.read_lock_holder(tmp_path) is None
    records.remove_lock_holder(tmp_path)
    assert not records.holder_path(tmp_path).exists()
