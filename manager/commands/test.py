"""`manager test`: the real sync (plus requirements-test.txt), then pytest.

Uses the CPU stack when no supported GPU is detected, so it runs anywhere. Arguments
after `test` go to pytest unchanged. Returns pytest's exit code.
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


@dataclass(frozen=True)
class Options:
    pytest_args: tuple[str, ...] = ()
    cpu: bool = False


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
    argv = [str(p.venv_python), "-m", "pytest", *options.pytest_args]
    return subprocess.call(argv, cwd=p.root, env=process.clean_env())
