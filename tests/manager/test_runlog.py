"""The sync's detail log (runlog.py): where it goes, how many are kept, and the
fallback to stderr when the checkout cannot take a log."""

from __future__ import annotations

import sys

from manager import runlog
from manager.paths import Paths


def test_the_log_is_under_logs_and_only_the_newest_are_kept(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in range(12):
        (logs / f"sync-20260101-0000{n:02d}.log").write_text("old\n")
    (logs / "install-20260101-000000.log").write_text("another command's\n")
    with runlog.open_log(Paths(tmp_path), "sync", keep=10) as log:
        log.note("detail")
        assert log.relative(tmp_path) == f"logs/{log.path.name}"
    assert "detail" in log.path.read_text()
    kept = sorted(p.name for p in logs.glob("sync-*.log"))
    assert len(kept) == 10 and log.path.name in kept
    assert "sync-20260101-000000.log" not in kept  # the oldest went
    assert (logs / "install-20260101-000000.log").exists()


def test_two_logs_in_one_second_do_not_collide(tmp_path):
    with runlog.open_log(Paths(tmp_path), "sync") as first:
        with runlog.open_log(Paths(tmp_path), "sync") as second:
            assert first.path != second.path


def test_no_log_possible_means_the_detail_goes_to_stderr(tmp_path):
    (tmp_path / "logs").write_text("a file where the folder should be")
    with runlog.open_log(Paths(tmp_path), "sync") as log:
        assert log.path is None and log.stream is sys.stderr
        assert log.relative(tmp_path) is None
