"""aitk_common.jobstates: the one table of job states and what each allows."""

from __future__ import annotations

import json

import pytest

from aitk_common import jobstates
from aitk_common.jobstates import ACTIVE, ALLOWED, ENDED, STARTABLE, Action, JobState


def test_every_state_has_its_actions_and_the_names_are_plain_strings():
    assert set(ALLOWED) == set(JobState)
    assert json.dumps([JobState.RUNNING, Action.STOP]) == '["running", "stop"]'
    assert f"{JobState.STOPPED}" == "stopped" and "running" in ACTIVE
    assert {"finished", "stopped", "failed"} == {s.value for s in ENDED}


def test_what_each_state_allows():
    assert jobstates.actions("created") == ["start", "queue", "edit", "delete",
                                            "delete_outputs", "copy"]
    assert jobstates.actions("running") == ["stop", "save_now", "sample_now", "copy"]
    assert jobstates.actions("stopping") == ["copy"]
    assert jobstates.actions("queued") == ["stop", "delete", "copy"]
    assert "resume" in jobstates.actions("failed") and "rerun" in jobstates.actions("finished")
    # Only a job whose trainer is not running may start, and never twice.
    assert STARTABLE == {JobState.CREATED, JobState.FINISHED, JobState.STOPPED,
                         JobState.FAILED}
    for state in ACTIVE:
        assert not ALLOWED[state] & {Action.EDIT, Action.DELETE, Action.DELETE_OUTPUTS}
    assert jobstates.is_active("stopping") and not jobstates.is_active("queued")
    with pytest.raises(ValueError):
        jobstates.actions("paused")
