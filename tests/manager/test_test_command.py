"""`manager test --quick`: the quick tier is pytest's `-m "not slow"`, placed before the
user's own arguments (so their `-m` wins); everything else still passes through."""

from __future__ import annotations

import pytest

from manager.cli import main
from manager.commands import test as test_cmd


def test_quick_selects_the_tests_not_marked_slow():
    assert test_cmd.Options(quick=True, pytest_args=("-x", "tests/aitk")).pytest_argv() == [
        "-m", "not slow", "-x", "tests/aitk"]
    assert test_cmd.Options(pytest_args=("-x",)).pytest_argv() == ["-x"]  # the whole suite


@pytest.mark.parametrize("argv, quick, rest", [
    (["test", "--quick"], True, ()),
    (["test", "--quick", "-x", "-k", "sync"], True, ("-x", "-k", "sync")),
    (["test", "tests/manager", "--quick", "-q"], True, ("tests/manager", "-q")),
    (["test", "--cpu", "-m", "slow"], False, ("-m", "slow")),
])
def test_the_verb_reads_quick_and_passes_the_rest_to_pytest(argv, quick, rest, monkeypatch):
    seen: list[test_cmd.Options] = []
    monkeypatch.setattr(test_cmd, "run", lambda options: seen.append(options) or 0)
    assert main(argv) == 0
    [options] = seen
    assert (options.quick, options.pytest_args) == (quick, rest)


def test_a_users_marker_expression_replaces_the_tiers(pytester: pytest.Pytester):
    """pytest keeps the last `-m`: `--quick -m slow` runs the slow tests."""
    pytester.makeini("[pytest]\nmarkers = slow: a slow test\n")
    pytester.makepyfile("import pytest\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n\n"
                        "def test_quick():\n    pass\n")
    argv = test_cmd.Options(quick=True, pytest_args=("-m", "slow")).pytest_argv()
    pytester.runpytest(*argv).assert_outcomes(passed=1, deselected=1)
    pytester.runpytest(*test_cmd.Options(quick=True).pytest_argv()).assert_outcomes(
        passed=1, deselected=1)
