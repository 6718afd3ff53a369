"""The installer failure line shown to people: the telling one, not the last one."""

from __future__ import annotations

from manager.installer import Outcome


def test_uv_resolution_cause() -> None:
    out = ("error: No solution found when resolving dependencies\n"
           "  cause: Because there is no version of tv==1+cpu, the request fails.\n")
    assert Outcome(False, out).last_line().startswith("Because there is no version of tv")


def test_pip_first_error_beats_the_generic_one() -> None:
    out = ("Collecting tv\nERROR: Cannot install tv==1 because of a conflict.\n"
           "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io\n")
    assert Outcome(False, out).last_line() == "ERROR: Cannot install tv==1 because of a conflict."


def test_otherwise_the_last_line() -> None:
    assert Outcome(False, "one\ntwo\n").last_line() == "two"
    assert Outcome(False, "").last_line() == "(no output)"
