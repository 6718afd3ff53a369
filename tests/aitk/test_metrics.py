"""The JSON-lines loss log and plain progress lines."""

from __future__ import annotations

import io
import json
from pathlib import Path

from aitk.run.metrics import Metrics, trim_log


def test_log_lines_hold_step_loss_lr_time_and_plain_progress(tmp_path: Path):
    stream = io.StringIO()
    m = Metrics(tmp_path / "loss_log.jsonl", total_steps=3, start_step=0, name="job",
                stream=stream)
    for step in (1, 2, 3):
        m.log(step, 0.5 / step, 1e-3)
    m.close()
    rows = [json.loads(line) for line in (tmp_path / "loss_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) == {"step", "loss", "lr", "time"}
    assert not m.interactive
    text = stream.getvalue()
    assert text.startswith("step 1/3 loss 0.5000") and "step 3/3" in text and "it/s" in text


def test_resume_trims_entries_past_the_checkpoint(tmp_path: Path):
    log = tmp_path / "loss_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8))
                   + '{"step": 8, "lo')  # torn by a hard kill
    trim_log(log, 5)
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_messages_stay_one_line_in_a_log(tmp_path: Path):
    stream = io.StringIO()
    m = Metrics(tmp_path / "loss_log.jsonl", total_steps=3, start_step=0, name="job",
                stream=stream)
    text = f"saved {'a_long_job_name_' * 8}000000050.safetensors and checkpoint step_50"
    m.message(text)
    m.close()
    assert stream.getvalue() == text + "\n"


def test_a_loss_log_the_trainer_did_not_write_is_left_alone(tmp_path: Path):
    """Issue 14: the resume trim rewrites loss_log.jsonl; someone else's file of that
    name (or a link) is neither trimmed nor appended to."""
    stream = io.StringIO()
    log = tmp_path / "loss_log.jsonl"
    log.write_text("my notes\n" + json.dumps({"step": 9, "loss": 1.0}) + "\n")
    m = Metrics(log, total_steps=3, start_step=0, name="job", stream=stream)
    m.log(1, 0.5, 1e-3)
    m.close()
    assert log.read_text() == "my notes\n" + json.dumps({"step": 9, "loss": 1.0}) + "\n"
    assert (f"{log} was not written by aitk; left as it is (this run's losses are not "
            "logged to a file)") in stream.getvalue()

    target = tmp_path / "elsewhere.jsonl"
    target.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    log.unlink()
    log.symlink_to(target)
    Metrics(log, total_steps=3, start_step=0, name="job", stream=io.StringIO()).close()
    assert log.is_symlink() and target.read_text() == json.dumps({"step": 1, "loss": 1.0}) + "\n"


def test_its_own_loss_log_with_a_torn_last_line_is_trimmed_and_appended(tmp_path: Path):
    log = tmp_path / "loss_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0, "lr": 0.1, "time": 0.0}) + "\n"
                           for s in (1, 2, 3)) + '{"step": 4, "lo')
    m = Metrics(log, total_steps=5, start_step=2, name="job", stream=io.StringIO())
    m.log(3, 0.5, 1e-3)
    m.close()
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2, 3]
