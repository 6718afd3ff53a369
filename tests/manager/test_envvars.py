"""AITK_* settings: a bad value is a usage error naming the variable, never ignored."""

from __future__ import annotations

import pytest

from manager import envvars, errors, lock, repo


@pytest.mark.parametrize("raw", ["abc", "0", "-5"])
def test_bad_seconds_are_a_usage_error_naming_the_variable(raw):
    with pytest.raises(errors.UsageError, match="AITK_X"):
        envvars.seconds("AITK_X", 10.0, {"AITK_X": raw})


def test_seconds_default_and_value():
    assert envvars.seconds("AITK_X", 10.0, {}) == 10.0
    assert envvars.seconds("AITK_X", 10.0, {"AITK_X": " 2.5 "}) == 2.5


def test_choice():
    assert envvars.choice("AITK_I", ("uv", "pip"), {}) is None
    assert envvars.choice("AITK_I", ("uv", "pip"), {"AITK_I": "PIP"}) == "pip"
    with pytest.raises(errors.UsageError, match="AITK_I='bogus'"):
        envvars.choice("AITK_I", ("uv", "pip"), {"AITK_I": "bogus"})


def test_lock_and_git_timeouts_use_it(monkeypatch):
    monkeypatch.setenv(lock.TIMEOUT_ENV, "abc")
    with pytest.raises(errors.UsageError):
        lock.timeout_from_env()
    with pytest.raises(errors.UsageError):
        repo.timeout_from_env({repo.TIMEOUT_ENV: "abc"})
