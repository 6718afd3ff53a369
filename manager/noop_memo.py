"""A no-op `sync` answered from its last answer, before the venv's interpreter starts.

A plain `sync` that finds nothing to do still pays a second interpreter (the bootstrap
execs into `.venv`), the manager's imports, the machine's detection (nvidia-smi runs in
it) and the plan: 0.15 s here against uv's own no-op at 0.01 s, and far more on a GPU
machine. So the bootstrap (stdlib only) first computes a key over everything that plan
reads, cheaply, from file metadata: the spec and the requirement files, the manager's
own code, the venv's state, marker and package listing, the local tools, the web UI's
sources and build, the environment, the detection tools on PATH and this boot of this
machine (a GPU or driver change comes with a reboot or changes those files). When the
key matches the one recorded with the last no-op answer, that answer is printed again
and nothing else runs.

The key is recorded only after a plain `sync` (`[--cpu] [--json] [--dry-run]`) found
nothing to do and printed its answer (manager/noop_sync.py): the bootstrap hands the key
to the venv's interpreter in `AITK_NOOP_KEY`, and that run writes the memo. Skip by
input hash, recorded only after success (docs/style.md 4). Anything that changes what a
sync would do changes a file or a variable the key covers; any doubt (no memo, a
damaged one, another key) takes the usual path.
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

ENV_KEY = "AITK_NOOP_KEY"
MEMO_NAME = "aitk_noop_memo.json"  # in .venv: a new venv starts without one
VERSION = 1
FLAGS = frozenset({"--cpu", "--json", "--dry-run"})
# Variables a shell changes between two identical commands; everything else counts.
VOLATILE_ENV = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", ENV_KEY,
                          "AITK_BOOTSTRAP_DROPPED"})
# Read by the plan or the answer, relative to the checkout.
FILES = ("spec.py", "requirements.txt", "dgx_requirements.txt", "run.py",
         "ui/package.json", "ui/package-lock.json", "ui/build.mjs", "ui/.build-stamp.json",
         ".venv/pyvenv.cfg", ".venv/aitk_manager_state.json",
         ".venv/aitk_manager_state.json.bak", ".venv/aitk_bootstrap.txt")
TREES = ("manager", "ui/src")  # every file in them, by stat
# Names (and the folder's stat) of: the checkout (a `.venv.old` to recover), the local
# tools, the built web UI. Not `.venv` itself: the memo is written there.
LISTINGS = (".", ".uv", ".node", ".ffmpeg", ".mingit", "ui/dist")
PROBES = ("nvidia-smi", "rocm-smi", "rocminfo", "amd-smi", "sysctl")  # detect.py runs them
# The manager's testing and support overrides (another root, a spec file, faked host
# facts): a run with one is never answered from a memo.
OVERRIDES = ("AITK_ROOT", "AITK_SPEC_FILE", "AITK_PROBE", "AITK_NO_BOOTSTRAP", "AITK_HOST_")
MACHINE_FILES = ("/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version",
                 "/usr/lib/wsl/lib/nvidia-smi", "/dev/kfd")


def flags_of(argv: "list[str]") -> "tuple[str, ...] | None":
    """The flags of a plain `sync`, sorted; None for any other command line."""
    if not argv or argv[0] != "sync" or not set(argv[1:]) <= FLAGS:
        return None
    return tuple(sorted(set(argv[1:])))


def _stat(path: Path) -> "list[int] | None":
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def _names(folder: Path) -> "list[object]":
    try:
        with os.scandir(folder) as entries:
            return [_stat(folder), sorted(e.name for e in entries)]
    except OSError:
        return []


def _tree(folder: Path) -> "list[object]":
    out: list[object] = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out.append([os.path.relpath(top, folder), sorted(files)])
        out.extend(_stat(Path(top) / name) for name in sorted(files))
    return out


def _site_packages(venv: Path) -> "list[object]":
    """The package listing the plan reads (its dist-info folders), by name and stat."""
    found = sorted(venv.glob("lib/python*/site-packages")) + [venv / "Lib" / "site-packages"]
    return [_names(folder) for folder in found]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return ""


def inputs(root: Path, flags: "tuple[str, ...]") -> "list[object]":
    """Everything the key is made of, as plain data (tests compare it part by part)."""
    env = {k: v for k, v in os.environ.items() if k not in VOLATILE_ENV}
    path = env.get("PATH", "")
    probes = {name: shutil.which(name, path=path) for name in PROBES}
    return [
        VERSION, list(flags), sys.version, sys.platform,
        {name: _stat(root / name) for name in FILES},
        {name: _tree(root / name) for name in TREES},
        {name: _names(root / name) for name in LISTINGS},
        _site_packages(root / ".venv"),
        sorted(env.items()),
        {name: [where, _stat(Path(where)) if where else None]
         for name, where in probes.items()},
        {name: [_read(name), _stat(Path(name))] for name in MACHINE_FILES},
    ]


def key(root: Path, argv: "list[str]") -> "str | None":
    """The memo's key for this command line; None when it is not one a memo answers."""
    flags = flags_of(argv)
    if flags is None or any(k.startswith(OVERRIDES) for k in os.environ):
        return None
    data = json.dumps(inputs(root, flags), default=str, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8", "surrogateescape")).hexdigest()


def memo_path(root: Path) -> Path:
    return root / ".venv" / MEMO_NAME


def answer(root: Path, argv: "list[str]") -> "int | None":
    """The bootstrap's side: print the recorded answer and return its exit code when
    the key matches; else None, with the key in the environment for the venv's run."""
    try:
        current = key(root, argv)
    except Exception:  # noqa: BLE001 - a memo is only ever a shortcut
        return None
    if current is None:
        return None
    os.environ[ENV_KEY] = current
    try:
        memo = json.loads(memo_path(root).read_text(encoding="utf-8"))
        if memo.get("version") != VERSION or memo.get("key") != current:
            return None
        stdout, code = memo["stdout"], memo["exit_code"]
        if not isinstance(stdout, str) or not isinstance(code, int):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    sys.stdout.write(stdout)
    sys.stdout.flush()
    return code


def record(root: Path, stdout: str, exit_code: int) -> None:
    """The venv's side, after a no-op answer was printed: keep it under the key the
    bootstrap computed (none: this run did not come through the bootstrap)."""
    current = os.environ.get(ENV_KEY)
    if not current:
        return
    from aitk_common.files import atomic_write_json  # the venv's side only

    try:
        atomic_write_json(memo_path(root), {"version": VERSION, "key": current,
                                            "exit_code": exit_code, "stdout": stdout})
    except OSError:  # a read-only venv: no shortcut next time, nothing else
        pass
