"""Run a command with a folder mounted read-only, for real: a read-only bind mount in a
private user and mount namespace (`unshare -rm`). chmod would not do: the tests run as
root, whom permissions do not stop; a read-only mount stops everyone (EROFS)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

_SCRIPT = ('set -e; for d in "$@"; do [ "$d" = -- ] && break; '
           'mount --bind "$d" "$d"; mount -o remount,bind,ro "$d"; done; '
           'while [ "$1" != -- ]; do shift; done; shift; exec "$@"')


@functools.lru_cache(maxsize=1)
def _unavailable() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    folder = tempfile.mkdtemp(prefix="aitk-ro-probe-")
    try:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", _SCRIPT + " 2>&1", "sh", folder,
                                "--", "sh", "-c", f"! touch {folder}/x 2>/dev/null"],
                               capture_output=True, text=True, timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if probe.returncode != 0:
        said = probe.stdout.strip() or probe.stderr.strip()
        return f"no user namespaces with mounts here ({said})"
    return None


def require_read_only_mounts() -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(f"read-only mounts unavailable: {reason}")


def run_read_only(folders: Sequence[Path], argv: Sequence[str], *, cwd: Path,
                  env: Mapping[str, str], timeout: float = 120
                  ) -> subprocess.CompletedProcess[str]:
    """argv with each of `folders` mounted read-only (everything else as it is)."""
    require_read_only_mounts()
    command = ["unshare", "-rm", "sh", "-c", _SCRIPT, "sh", *map(str, folders), "--", *argv]
    done = subprocess.run(command, cwd=cwd, env=dict(env), capture_output=True, text=True,
                          timeout=timeout)
    _remove_named_logs(done.stderr)
    return done


def _remove_named_logs(stderr: str) -> None:
    """A read-only checkout logs its error to the temp folder: don't leave it there."""
    for found in re.finditer(r"details in (\S+?\.log)\)", stderr):
        log = Path(found.group(1))
        if log.name.startswith("aitk-manager-error-"):
            log.unlink(missing_ok=True)
