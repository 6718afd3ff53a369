"""Environment hazards (PYTHONPATH, an active conda env or foreign venv, a checkout path
that breaks PATH entries) and which secrets are set. Secrets are named, never shown."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from manager.health import secrets
from manager.health.check import Check, Probe, ok, warn
from manager.paths import Paths

# Set by the bootstrap (manager/__main__.py) when it re-executes inside .venv: the caller's
# variables it removed, so doctor judges the environment the user actually has.
DROPPED_VAR = "AITK_BOOTSTRAP_DROPPED"


def caller_environment(environ: Mapping[str, str]) -> dict[str, str]:
    if DROPPED_VAR not in environ:
        return dict(environ)
    try:
        dropped = json.loads(environ[DROPPED_VAR])
    except ValueError:
        dropped = {}
    # The bootstrap may have set PYTHONPATH itself (to find the package from any folder).
    env = {k: v for k, v in environ.items() if k not in (DROPPED_VAR, "PYTHONPATH")}
    env.update({str(k): str(v) for k, v in dropped.items()})
    return env


def judge_pythonpath(env: Mapping[str, str]) -> Check:
    found = [n for n in ("PYTHONPATH", "PYTHONHOME") if env.get(n)]
    if found:
        return warn("env.pythonpath", f"{' and '.join(found)} set: the manager drops it for "
                    "what it starts, but a hand-run `python run.py` imports foreign packages",
                    f"unset {' '.join(found)}")
    return ok("env.pythonpath", "PYTHONPATH not set")


def judge_conda(env: Mapping[str, str]) -> Check:
    name = env.get("CONDA_DEFAULT_ENV") or env.get("CONDA_PREFIX")
    if name:
        return warn("env.conda", f"a conda environment is active ({name}): its libraries can "
                    "shadow the venv's", "conda deactivate  (repeat until none is active)")
    return ok("env.conda", "no conda environment active")


def judge_venv_active(env: Mapping[str, str], own_venv: Path) -> Check:
    active = env.get("VIRTUAL_ENV")
    if active and Path(active).absolute() != own_venv.absolute():
        return warn("env.venv", f"another virtual environment is active ({active})",
                    "deactivate  (the manager uses the checkout's .venv)")
    return ok("env.venv", "no other virtual environment active")


def judge_path(root: Path, pathsep: str = os.pathsep) -> Check:
    """Spaces are fine (install.sh, the venv and launchers are tested in such a path).
    What breaks: the checkout's tool folders go on PATH and the loader path, where the
    path separator splits one folder into two; non-ASCII paths trip some native tools."""
    text = str(root)
    problems = []
    if pathsep in text:
        problems.append(f"a '{pathsep}' (it splits the local tools' folders on PATH and "
                        "the library path)")
    if not text.isascii():
        problems.append("non-ASCII characters (some native libraries fail on them)")
    if problems:
        return warn("env.path", f"the checkout path has {' and '.join(problems)} ({text})",
                    "move the checkout to a path without them, such as ~/aitk, delete its "
                    ".venv (a venv records absolute paths), then run ./install.sh")
    return ok("env.path", f"checkout at {text}")


def judge_secrets(env: Mapping[str, str]) -> Check:
    shown = [f"{n} {'set' if env.get(n) else 'unset'}" for n in secrets.secret_names(env)]
    return ok("env.secrets", ", ".join(shown) + " (values never shown)")


def probe(paths: Paths, environ: Mapping[str, str]) -> list[Check]:
    env = caller_environment(environ)
    return [judge_pythonpath(env), judge_conda(env), judge_venv_active(env, paths.venv),
            judge_path(paths.root), judge_secrets(env)]


IDS = ("env.pythonpath", "env.conda", "env.venv", "env.path", "env.secrets")


def probes(paths: Paths, environ: Mapping[str, str]) -> list[Probe]:
    return [Probe(IDS, lambda: probe(paths, environ), 5.0)]
