#!/usr/bin/env python3
"""CI: the tests of the stdlib-only parts (spec.py, the bootstrap, hardware detection)
on every supported Python found on this machine, each in a small venv holding only
pytest. The main suite runs on one Python; these parts must work from any bare one.

    python3 .ci/stdlib_pythons.py        (after `python3 -m manager test`, for .venv/bin/uv)

An absent interpreter is skipped with the reason; exit 1 when any run fails.
Interpreters: `python3.X` under pyenv (PYENV_ROOT, `pyenv root`, ~/.pyenv), else on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUPPORTED = tuple((3, minor) for minor in range(10, 15))  # spec.py: >=3.10,<3.15
TESTS = ("tests/manager/test_spec.py", "tests/manager/test_detect.py",
         "tests/manager/test_bootstrap.py", "tests/manager/test_exit_codes.py")
# These start the manager's CLI (which runs in .venv, not in the Python under test) or
# build a whole .venv from the network: the main suite runs them.
DESELECT = "not through_cli and not round_trip and not from_bare_python"


def pyenv_roots(environ: Mapping[str, str]) -> list[Path]:
    roots = [Path(environ["PYENV_ROOT"])] if environ.get("PYENV_ROOT") else []
    pyenv = shutil.which("pyenv", path=environ.get("PATH"))
    if pyenv:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.strip():
            roots.append(Path(done.stdout.strip()))
    roots.append(Path(environ.get("HOME", "~")).expanduser() / ".pyenv")
    return list(dict.fromkeys(roots))


def _patch(folder: Path) -> int:
    found = re.fullmatch(r"\d+\.\d+\.(\d+)", folder.name)
    return int(found[1]) if found else -1


def find_python(version: tuple[int, int], roots: Sequence[Path],
                path: str | None) -> Path | None:
    """The newest final release of that version under a pyenv root, else on PATH."""
    name = f"python{version[0]}.{version[1]}"
    for root in roots:
        prefix = f"{version[0]}.{version[1]}."
        builds = [d for d in (root / "versions").glob(prefix + "*") if _patch(d) >= 0]
        for build in sorted(builds, key=_patch, reverse=True):
            exe = build / "bin" / name
            if exe.is_file() and os.access(exe, os.X_OK):
                return exe
    on_path = shutil.which(name, path=path)
    return Path(on_path) if on_path else None


def pinned(requirement: str, requirements: Path = ROOT / "requirements-test.txt") -> str:
    for line in requirements.read_text().splitlines():
        if line.split("==")[0].strip() == requirement:
            return line.strip()
    return requirement


def find_uv() -> str | None:
    for candidate in (ROOT / ".venv" / "bin" / "uv", ROOT / ".uv" / "uv"):
        if candidate.exists():
            return str(candidate)
    return shutil.which("uv")


def make_venv(python: Path, target: Path) -> Path:
    """A venv with only pytest (pinned as the main suite's); reused when it has it."""
    venv_python = target / "bin" / "python"
    if venv_python.exists() and subprocess.run(
            [str(venv_python), "-c", "import pytest"], capture_output=True).returncode == 0:
        return venv_python
    shutil.rmtree(target, ignore_errors=True)
    sys.path.insert(0, str(ROOT))
    from manager.indexes import read_config, uv_args, uv_env  # stdlib-only

    uv, config, env = find_uv(), read_config(), dict(os.environ)
    if uv:
        subprocess.run([uv, "venv", "-q", "--python", str(python), str(target)], check=True)
        env.update(uv_env(config))
        subprocess.run([uv, "pip", "install", "-q", "--python", str(venv_python),
                        *uv_args(config), pinned("pytest")], check=True, env=env)
    else:  # pip reads its own configuration
        subprocess.run([str(python), "-m", "venv", str(target)], check=True)
        subprocess.run([str(venv_python), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", pinned("pytest")], check=True)
    return venv_python


def main_suite_version(venv: Path = ROOT / ".venv") -> tuple[int, int] | None:
    """The Python the main suite runs on (it runs these tests already)."""
    try:
        text = (venv / "pyvenv.cfg").read_text()
    except OSError:
        return None
    found = re.search(r"^version(?:_info)?\s*=\s*(\d+)\.(\d+)", text, re.MULTILINE)
    return (int(found[1]), int(found[2])) if found else None


def main() -> int:
    cache = Path(os.environ.get("AITK_CI_PYTHONS", Path(tempfile.gettempdir())
                                / "aitk-ci-pythons"))
    roots = pyenv_roots(os.environ)
    failed = []
    for version in SUPPORTED:
        label = f"Python {version[0]}.{version[1]}"
        if version == main_suite_version():
            print(f"ci: {label}: skipped, the main suite runs on it")
            continue
        python = find_python(version, roots, os.environ.get("PATH"))
        if python is None:
            print(f"ci: {label}: skipped, not found (pyenv install {version[0]}."
                  f"{version[1]}, or put python{version[0]}.{version[1]} on PATH)")
            continue
        try:
            venv_python = make_venv(python, cache / f"py{version[0]}{version[1]}")
        except (OSError, subprocess.CalledProcessError) as exc:  # no index reachable
            print(f"ci: {label}: skipped, could not make a venv with pytest ({exc})")
            continue
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        done = subprocess.run([str(venv_python), "-m", "pytest", "-q", "-p",
                               "no:cacheprovider", "-k", DESELECT, *TESTS], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"ci: {label} ({python}): {last}")
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            failed.append(label)
    if failed:
        print(f"ci: the stdlib-only tests failed on {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
