"""The JSON-lines loss log and plain progress lines."""

from __future__ import annotations

import io
import json
from pathlib import Path

from aitk.metrics import Metrics, trim_log


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
