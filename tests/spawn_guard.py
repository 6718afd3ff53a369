"""A pytest plugin: a test that starts the trainer must carry the `slow` marker.

The quick tier (`-m "not slow"`, `python3 -m manager test --quick`) stays quick only if
every test that pays for a trainer process says so. Trusting each author to remember
does not hold, so for the whole session `subprocess.Popen` (which `run`, `call`,
`check_output` and asyncio's subprocesses all go through) is wrapped: when a test
without `slow` starts the trainer, the start is refused with `UnmarkedTrainerStart`,
and the test is reported as failed even if the code under test caught that error.

"The trainer" is a command line naming this checkout's `run.py` or the tests' paused
copy of it (`tests/aitk/paused_run.py`), the trainer module (`-m aitk run`,
`aitk.cli_run`) or torchrun (the `torchrun` script, `-m torch.distributed.run`,
`aitk.torchrun` in a `-c` snippet). A stand-in `run.py` in a temporary checkout (the
manager's launch tests) is not the trainer, and neither is `--help` or `--check` (the
preflight alone): both answer before any model loads. What a shell would run
(`sh -c "... run.py ..."`, `shell=True`) is split into words and checked too.

Loaded by tests/conftest.py; `-p tests.spawn_guard` loads it into any pytest run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.guard_hooks import Guard, add_hooks

REPO = Path(__file__).resolve().parents[1]
TRAINER_FILES = frozenset({REPO / "run.py", REPO / "tests" / "aitk" / "paused_run.py"})
TRAINER_MODULES = frozenset({"aitk.cli_run", "torch.distributed.run",
                             "torch.distributed.launch"})
# Python snippets (`python -c CODE`) that start a run in the child.
TRAINER_CODE = re.compile(r"\baitk\.cli_run\b|\bfrom aitk import torchrun\b|\btorchrun\.launch\(")
PYTHON = re.compile(r"python[\d.]*(\.exe)?")
# Asked for these, the trainer answers before loading anything (help, the preflight).
NEVER_TRAINS = ("--help", "--check")
MARKER = "slow"


class UnmarkedTrainerStart(RuntimeError):
    """A test without the `slow` marker tried to start the trainer."""


def _command_lines(args: object) -> list[list[str]]:
    """The argument list, then the words of each part a shell will split: the one
    string of `shell=True` (or of a program given as a string), the command after `-c`."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = [os.fsdecode(args)]
        shell = [0]
    elif isinstance(args, Iterable):
        argv = [os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else str(a)
                for a in args]
        shell = [i + 1 for i, a in enumerate(argv[:-1]) if a == "-c"]
    else:
        return [[str(args)]]
    lines = [argv]
    for i in shell:
        try:
            lines.append(shlex.split(argv[i]))
        except ValueError:  # not shell syntax (a quote left open, Python code): skip it
            pass
    return lines


def _trainer_in_words(words: list[str], base: Path) -> str | None:
    if any(word in NEVER_TRAINS for word in words):
        return None
    for i, word in enumerate(words):
        if Path(word).name == "torchrun":
            return "torchrun"
        if word == "-m" and i + 1 < len(words):
            if words[i + 1] in TRAINER_MODULES:
                return f"-m {words[i + 1]}"
            if words[i + 1:i + 3] == ["aitk", "run"]:
                return "-m aitk run"
        code = words[i + 1] if word == "-c" and i + 1 < len(words) else ""
        if TRAINER_CODE.search(code) and not any(flag in code for flag in NEVER_TRAINS):
            return "python -c code that starts a run"
        if (word.endswith(".py") and (base / word).resolve() in TRAINER_FILES
                and _run_as_script(words, i)):
            return (base / word).resolve().relative_to(REPO).as_posix()
    return None


def _run_as_script(words: list[str], i: int) -> bool:
    """Whether words[i] is the script a Python runs (`python [-X opt ...] FILE`) or the
    program itself, not a file some other program reads (`vermin ... run.py`)."""
    j = i - 1
    while j >= 0 and words[j].startswith("-") or j >= 1 and words[j - 1] in ("-X", "-W"):
        j -= 1
    return j < 0 or PYTHON.fullmatch(Path(words[j]).name) is not None


def trainer_in(args: object, cwd: str | os.PathLike[str] | None = None) -> str | None:
    """What in this command line starts the trainer (a short description), or None."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    for words in _command_lines(args):
        found = _trainer_in_words(words, base)
        if found is not None:
            return found
    return None


class SpawnGuard(Guard):
    """Holds the test being run and the unmarked trainer starts seen in it."""

    def __init__(self) -> None:
        super().__init__()
        self._real_init = subprocess.Popen.__init__

    def install(self) -> None:
        guard, real_init = self, self._real_init

        def guarded_init(popen: subprocess.Popen, args, *rest, **kwargs) -> None:
            __tracebackhide__ = True
            guard.check(args, kwargs.get("cwd"))
            real_init(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = guarded_init  # type: ignore[method-assign]

    def uninstall(self) -> None:
        subprocess.Popen.__init__ = self._real_init  # type: ignore[method-assign]

    def check(self, args: object, cwd: str | os.PathLike[str] | None) -> None:
        __tracebackhide__ = True  # the report shows the test's own line, not ours
        item = self.item
        if item is None or item.get_closest_marker(MARKER) is not None:
            return
        what = trainer_in(args, cwd)
        if what is None:
            return
        message = (f"{item.nodeid} starts the trainer ({what}) but is not marked "
                   f"`{MARKER}`: add @pytest.mark.{MARKER} (or a module-level "
                   f"`pytestmark = pytest.mark.{MARKER}`); see docs/testing.md")
        self.refused.append(message)
        raise UnmarkedTrainerStart(message)


_guard = SpawnGuard()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: starts a trainer process or a full "
                                       "install; left out of the quick tier")
    _guard.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    _guard.uninstall()


add_hooks(globals(), _guard)
