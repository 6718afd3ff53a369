"""`manager test --quick`: the quick tier is pytest's `-m "not slow"`, and both tiers run
on every core (`-n auto`), placed before the user's own arguments (so their `-m` and `-n`
win); everything else still passes through."""

from __future__ import annotations

import pytest

from manager.cli import main
from manager.commands import test as test_cmd


def test_quick_selects_the_tests_not_marked_slow():
    assert test_cmd.Options(quick=True, pytest_args=("-x", "tests/aitk")).pytest_argv() == [
        "-m", "not slow", *test_cmd.PARALLEL, "-x", "tests/aitk"]
    assert test_cmd.Options(pytest_args=("-x",)).pytest_argv() == [  # the whole suite
        *test_cmd.PARALLEL, "-x"]


@pytest.mark.parametrize("flag", ["--pdb", "--trace", "no:xdist"])
def test_a_debugger_or_no_xdist_runs_in_one_process(flag: str):
    argv = test_cmd.Options(quick=True, pytest_args=("-p", flag) if flag == "no:xdist"
                            else (flag,)).pytest_argv()
    assert "-n" not in argv and argv[:2] == ["-m", "not slow"]


def test_the_workers_run_the_tests(pytester: pytest.Pytester, monkeypatch):
    """The parallel arguments are ones the installed pytest-xdist takes, and each test
    runs once, in a worker; a user's own `-n 0` replaces them (one process)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this suite's own worker
    pytester.makepyfile("import os\n\ndef test_a():\n    assert os.environ.get("
                        "'PYTEST_XDIST_WORKER')\n\ndef test_b():\n    pass\n")
    pytester.runpytest_subprocess(*test_cmd.Options().pytest_argv()).assert_outcomes(
        passed=2)
    serial = pytester.runpytest_subprocess(*test_cmd.Options(pytest_args=("-n", "0"))
                                           .pytest_argv())
    serial.assert_outcomes(passed=1, failed=1)  # test_a: no worker in one process


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
    one_process = ("-p", "no:xdist")  # xdist's workers do not report the deselected
    argv = test_cmd.Options(quick=True, pytest_args=("-m", "slow", *one_process)).pytest_argv()
    pytester.runpytest(*argv).assert_outcomes(passed=1, deselected=1)
    pytester.runpytest(*test_cmd.Options(quick=True, pytest_args=one_process).pytest_argv()
                       ).assert_outcomes(passed=1, deselected=1)
