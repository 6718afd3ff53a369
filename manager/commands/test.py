"""`manager test`: the real sync (plus requirements-test.txt), then pytest.

Uses the CPU stack when no supported GPU is detected, so it runs anywhere. Arguments
after `test` go to pytest unchanged. `--quick` runs the quick tier: every test but those
marked `slow` (they start a trainer process or a full install; docs/testing.md).
Both run on every core through pytest-xdist (`-n auto`); a `-n` of the user's own
replaces it, and a debugger flag or `-p no:xdist` runs in one process.
Returns pytest's exit code.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from manager import errors, lock, process
from manager.commands import sync
from manager.paths import paths
from manager.specsource import current_spec
from manager.state import read_state

TEST_REQUIREMENTS = "requirements-test.txt"
# pytest's marker expression for the quick tier (the marker is registered in pyproject.toml).
QUICK_TIER = "not slow"
# pytest-xdist (requirements-test.txt): a worker per core; worksteal, because a few
# trainer-starting tests take far longer than the rest. It halves the quick tier here.
PARALLEL = ("-n", "auto", "--dist", "worksteal")
# Arguments that need the tests in this one process (xdist refuses --pdb and --trace).
SERIAL_ARGS = frozenset({"--pdb", "--trace", "no:xdist", "-pno:xdist"})


@dataclass(frozen=True)
class Options:
    pytest_args: tuple[str, ...] = ()
    cpu: bool = False
    quick: bool = False

    def pytest_argv(self) -> list[str]:
        """pytest's arguments. The tier's `-m` and the workers' `-n` come first: the
        same options among the user's own arguments come later and so replace them
        (pytest keeps the last)."""
        tier = ["-m", QUICK_TIER] if self.quick else []
        serial = any(arg in SERIAL_ARGS for arg in self.pytest_args)
        return [*tier, *(() if serial else PARALLEL), *self.pytest_args]


def _needs_cpu(requested: bool) -> bool:
    if requested or read_state(paths(), keep_backup=False).state.cpu_requested:
        return True
    try:
        current_spec(cpu=False)
    except errors.UnsupportedMachine:
        print("aitk: no supported GPU found; testing with the CPU build", file=sys.stderr)
        return True
    return False


def ensure_environment(cpu: bool) -> None:
    options = sync.Options(cpu=_needs_cpu(cpu), extra_requirements=(TEST_REQUIREMENTS,),
                           log_name="test")
    with lock.hold(paths(), "python3 -m manager test"):
        result = sync.run(options)
    for warning in result.data.get("warnings", []):
        print(f"aitk: warning: {warning}", file=sys.stderr)


def run(options: Options) -> int:
    ensure_environment(options.cpu)
    p = paths()
    argv = [str(p.venv_python), "-m", "pytest", *options.pytest_argv()]
    return subprocess.call(argv, cwd=p.root, env=process.clean_env())
