"""`manager test`: make sure the managed environment and test tools exist, run pytest.

Interim: installs the CPU stack with pip directly. The sync engine (issue 3) replaces
`ensure_environment` with a real sync.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass

from manager import errors, process
from manager.paths import paths

TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Options:
    pytest_args: tuple[str, ...] = ()
    cpu: bool = False


def _inputs_hash() -> str:
    root = paths().root
    h = hashlib.sha256(TORCH.encode())
    for name in ("requirements.txt", "requirements-test.txt"):
        h.update((root / name).read_bytes())
    return h.hexdigest()


def ensure_environment() -> None:
    p = paths()
    marker = p.venv / "aitk_test_env.txt"
    digest = _inputs_hash()
    if marker.exists() and marker.read_text().strip() == digest:
        return
    pip = [str(p.venv_python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    for args in ([TORCH], ["-r", "requirements.txt", "-r", "requirements-test.txt"]):
        done = process.run([*pip, *args], cwd=p.root, capture=False)
        if not done.ok:
            raise errors.ManagerError(f"installing {' '.join(args)} failed",
                                      hint="see the installer output above")
    marker.write_text(digest + "\n")


def run(options: Options) -> int:
    ensure_environment()
    p = paths()
    argv = [str(p.venv_python), "-m", "pytest", *options.pytest_args]
    return subprocess.call(argv, cwd=p.root, env=process.clean_env())
