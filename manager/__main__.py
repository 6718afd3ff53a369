"""Bootstrap: the only stdlib-only code of the manager.

`python3 -m manager ...` must work from a bare Python >= 3.10. When we are not yet
running inside the checkout's `.venv`, make sure it exists with the manager's own
dependencies (manager/requirements.txt), then re-execute the same command inside it.
Once set up, the cost is one `exec` and one small file read.

No `from __future__ import annotations` and no bare PEP 604/585 annotations here: an old
Python (3.6 on older distributions) must get as far as the version message.
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

# subprocess is imported where a venv is built or a child waited for: the usual run
# (the venv is there: exec into it) and a no-op sync inside it never need it.

MIN_PYTHON = (3, 10)
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
# Records the hash of REQUIREMENTS the venv was last bootstrapped with.
MARKER = VENV / "aitk_bootstrap.txt"
# The installers' output goes here, so the terminal keeps one line per step.
LOG = ROOT / "logs" / "bootstrap.log"

# Run as a script (`python3 path/to/checkout/manager ...`, from any folder): Python put
# the package's own folder first on sys.path, where its modules would shadow others
# (venv.py shadows the stdlib's venv); the checkout is what must be importable.
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(ROOT)


def venv_python(venv: Path = VENV) -> Path:
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def requirements_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def inside_venv() -> bool:
    try:
        return Path(sys.prefix).resolve() == VENV.resolve()
    except OSError:
        return False


def bootstrapped() -> bool:
    try:
        return MARKER.read_text().strip() == requirements_hash() and venv_python().exists()
    except OSError:
        return False


def clean_env() -> "dict[str, str]":
    # process.py is stdlib-only too, so the bootstrap shares its one list of hostile
    # variables; imported here, after the version check, since it needs Python 3.10.
    from manager.process import clean_env as cleaned

    return cleaned()


def dropped_env() -> "str":
    """The caller's variables clean_env removes, as JSON: `doctor` reports them."""
    from manager.process import HOSTILE_ENV

    return json.dumps({k: v for k, v in os.environ.items() if k in HOSTILE_ENV})


def find_uv() -> "str | None":
    local = ROOT / ".uv" / ("uv.exe" if os.name == "nt" else "uv")
    # The marker is written last by the tool installer: no marker, not trusted.
    if local.exists() and (ROOT / ".uv" / ".aitk-tool.json").exists():
        return str(local)
    return shutil.which("uv")


def say(message: str) -> None:
    print(f"aitk: {message}", file=sys.stderr, flush=True)


def open_log():  # -> "TextIO | None"; a read-only checkout: output stays on the terminal
    try:
        LOG.parent.mkdir(exist_ok=True)
        return open(LOG, "w", encoding="utf-8", errors="replace")
    except OSError:
        return None


def create_venv() -> None:
    """Make .venv hold the manager's dependencies (pip/uv output in logs/bootstrap.log).

    A venv that was bootstrapped before (the marker is there) only gets the changed
    requirements. Otherwise the first build happens aside, in .venv.bootstrap-<pid>, and
    is published by renames once complete: a kill at any point (even during venv's own
    pip step) leaves no half-built .venv, and a .venv without the marker, which an older
    bootstrap killed mid-build could leave without pip, is replaced, not trusted."""
    import subprocess

    log = open_log()
    out = {"stdout": log, "stderr": subprocess.STDOUT} if log is not None else {}
    try:
        if MARKER.exists() and venv_python().exists():
            install_requirements(VENV, out)
            write_marker(VENV)
            return
        clear_leftovers()
        build = ROOT / (BUILD_PREFIX + str(os.getpid()))
        shutil.rmtree(build, ignore_errors=True)
        say(f"creating {VENV.name} (built as {build.name}, then moved into place)")
        make_venv(build, out)
        install_requirements(build, out)
        write_marker(build)
        publish(build)
    finally:
        if log is not None:
            log.close()


BUILD_PREFIX = VENV.name + ".bootstrap-"  # git-ignored by /.venv.*/
RETIRED_PREFIX = VENV.name + ".unfinished-"


def make_venv(where: Path, out: dict) -> None:
    import subprocess

    uv = find_uv()
    if uv:
        cmd = [uv, "venv", "--seed", "--python", sys.executable, str(where)]
    else:
        cmd = [sys.executable, "-m", "venv", str(where)]
    subprocess.run(cmd, check=True, env=clean_env(), **out)


def install_requirements(venv: Path, out: dict) -> None:
    import subprocess

    env = clean_env()
    uv = find_uv()
    python = venv_python(venv)
    say("installing the manager's dependencies (manager/requirements.txt)"
        + (f"; output in {LOG.relative_to(ROOT)}" if out else ""))
    if uv:
        # uv does not read pip's configuration: hand it on the way the sync engine does
        # (indexes.py is stdlib-only, so the bootstrap can share it).
        from manager.indexes import read_config, uv_args, uv_env

        config = read_config(env)
        cmd = [uv, "pip", "install", "--compile-bytecode", "--python", str(python),
               *uv_args(config, env), "-r", str(REQUIREMENTS)]  # pip compiles by default
        env.update(uv_env(config, env))
    else:
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check",
               "-r", str(REQUIREMENTS)]
    subprocess.run(cmd, check=True, env=env, **out)


def write_marker(venv: Path) -> None:
    marker = venv / MARKER.name
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(requirements_hash() + "\n")
    os.replace(tmp, marker)


def publish(build: Path) -> None:
    """Move the finished build to .venv: retarget the paths it recorded, then rename."""
    from manager.venv import retarget_scripts  # stdlib-only, like process.py

    retarget_scripts(build, VENV)
    if bootstrapped():  # another run finished first: keep its venv
        shutil.rmtree(build, ignore_errors=True)
        return
    if os.path.lexists(VENV):  # never finished: set aside, then replaced
        retired = ROOT / (RETIRED_PREFIX + str(os.getpid()))
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(VENV, retired)
        os.replace(build, VENV)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(build, VENV)


def clear_leftovers() -> None:
    """Remove the builds of bootstrap runs that are gone (killed, interrupted)."""
    from manager.running_jobs import pid_alive  # stdlib-only; safe on Windows too

    for prefix in (BUILD_PREFIX, RETIRED_PREFIX):
        for path in ROOT.glob(prefix + "*"):
            pid = path.name[len(prefix):]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def restore_interrupted_swap() -> None:
    """A sync killed mid-swap leaves the verified venv as .venv.old: restored, not rebuilt."""
    if os.path.lexists(VENV):  # the usual case, answered without importing anything
        return
    from manager.paths import Paths  # stdlib-only, like process.py
    from manager.venv import restore_retired

    try:
        note = restore_retired(Paths(ROOT))
    except OSError as exc:  # a read-only checkout: the bootstrap below says what fails
        note = f"could not restore {VENV.name} from {VENV.name}.old: {exc}"
    if note:
        say(note)


def python_too_old(version_info: tuple = ()) -> "str | None":
    """The one-line message for a Python older than MIN_PYTHON, else None."""
    version = tuple(version_info or sys.version_info)
    if version[:2] >= MIN_PYTHON:
        return None
    need = ".".join(map(str, MIN_PYTHON))
    have = ".".join(map(str, version[:3]))
    return f"aitk: Python {need} or newer is required (this is {have})"


def main() -> int:
    too_old = python_too_old()
    if too_old:
        print(too_old, file=sys.stderr)
        return 1
    if inside_venv() or os.environ.get("AITK_NO_BOOTSTRAP") == "1":
        from manager import noop_sync  # a sync with nothing to do, without the CLI's cost

        answered = noop_sync.main(sys.argv[1:])
        if answered is not None:
            return answered
        from manager.cli import main as cli_main

        return cli_main()
    restore_interrupted_swap()
    if not bootstrapped():
        import subprocess

        try:
            create_venv()
        except (OSError, subprocess.CalledProcessError) as exc:
            say(f"could not set up {VENV}: {exc}")
            where = f"in {LOG}" if LOG.exists() else "above"
            say(f"fix the cause (the installer's output is {where}), or delete .venv and "
                "run the command again")
            return 1
        except KeyboardInterrupt:  # the marker is written last: the next run redoes it
            say("interrupted; run the command again to finish setting up")
            return 130
    from manager import noop_memo  # stdlib-only; a plain `sync` with nothing to do

    answered = noop_memo.answer(ROOT, sys.argv[1:])
    if answered is not None:
        return answered
    python = str(venv_python())
    argv = [python, "-m", "manager", *sys.argv[1:]]
    env = clean_env()
    env["AITK_BOOTSTRAP_DROPPED"] = dropped_env()
    if os.name == "nt":  # exec on Windows does not replace the process; wait instead
        import subprocess

        return subprocess.run(argv, env=env, cwd=ROOT).returncode
    if Path.cwd().resolve() != ROOT:
        env["PYTHONPATH"] = str(ROOT)  # `-m manager` must resolve from any folder
    os.execve(python, argv, env)
    return 1  # unreachable


if __name__ == "__main__":
    sys.exit(main())
