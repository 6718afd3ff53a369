"""The trainer's own preflight, run the way a user runs it: `run.py --check CONFIG` in a
child process, with the trainer's interpreter, from the checkout.

So the page refuses exactly what the trainer would refuse at start (the device asked for
exists, the optimizer can be built, datasets hold usable pictures, the arch is known,
the output folder is writable, ...), without the server importing torch. The trainer
reports its problems as data through its status file (`errors`: [{path, message}], the
same the web UI reads for a running job) and its warnings and notes as `LEVEL: PATH:
MESSAGE` lines (aitk.findings.Finding.line). When the trainer's `--check` also prints
JSON (`--json`, the memory forecast of issue 22), its `memory` object is passed on as it
is: {device_peak_bytes, host_peak_bytes, device_free_bytes, fits, hints}; None when the
trainer gives none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from aitk_common.status import ENV_VAR as STATUS_ENV
from aitk_common.status import parse_problems

TIMEOUT_S = 120.0
_LINE = re.compile(r"^(warning|info): (.*)$")
_FIX = re.compile(r" \(fix: (.*)\)$")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    errors: list[dict[str, str]] = field(default_factory=list)
    # {level, path, message}: what runs, but may not run as meant
    notes: list[dict[str, str]] = field(default_factory=list)
    memory: dict[str, Any] | None = None


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a trainer child gets: the server's, without PYTHONPATH (the
    checkout's own packages come first), unbuffered."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@cache
def takes_json(python: str, trainer: str) -> bool:
    """Whether this trainer's `--check` prints JSON (`--json`, once issue 22 lands)."""
    try:
        found = subprocess.run([python, trainer, "--help"], capture_output=True,
                               timeout=TIMEOUT_S, env=child_env(), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"--json" in found.stdout


def notes_from(stderr: str) -> list[dict[str, str]]:
    """The `warning: ...` and `info: ...` lines of a check as {level, path, message}."""
    out = []
    for line in stderr.splitlines():
        found = _LINE.match(line.strip())
        if not found:
            continue
        level, rest = found.groups()
        fix = _FIX.search(rest)
        text = rest[:fix.start()] + f" ({fix.group(1)})" if fix else rest
        problem = parse_problems([text])[0]
        out.append({"level": level, "path": problem.path, "message": problem.message})
    return out


def json_objects(stdout: str) -> list[dict[str, Any]]:
    """The objects `--check --json` printed (one per run: a line each, or one list)."""
    out: list[dict[str, Any]] = []
    for chunk in (stdout, *stdout.splitlines()):
        try:
            data = json.loads(chunk)
        except ValueError:
            continue
        out += [d for d in (data if isinstance(data, list) else [data]) if isinstance(d, dict)]
        if chunk is stdout:
            break
    return out


def problems_from(runs: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The error problems in the runs `--check --json` printed (json_objects), as
    {path, message} (the trainer then writes them nowhere else)."""
    found = []
    for run in runs:
        for problem in run.get("problems") or []:
            if not (isinstance(problem, dict) and problem.get("level") == "error"
                    and isinstance(problem.get("message"), str)):
                continue
            path, message = problem.get("path"), problem["message"]
            if not isinstance(path, str):  # a config error: "path: message" in one line
                parsed = parse_problems([message])[0]
                path, message = parsed.path, parsed.message
            fix = problem.get("fix")
            found.append({"path": path, "message": message + (
                f" ({fix})" if isinstance(fix, str) and fix else "")})
    return found


def memory_from(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The memory forecast of the first run `--check --json` printed, if any."""
    memory = runs[0].get("memory") if runs else None
    return memory if isinstance(memory, dict) else None


def check(text: str, *, python: str, trainer: Path, root: Path, scratch: Path,
          timeout: float = TIMEOUT_S) -> Verdict:
    """`run.py --check` on the config `text` (written to a file under `scratch`)."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="check-") as tmp:
        config, status = Path(tmp) / "config.yaml", Path(tmp) / "status.json"
        config.write_text(text, encoding="utf-8")
        argv = [python, str(trainer), "--check", str(config)]
        if takes_json(python, str(trainer)):
            argv.insert(3, "--json")
        try:
            done = subprocess.run(argv, cwd=root, capture_output=True, timeout=timeout,
                                  env=child_env({STATUS_ENV: str(status)}),
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return Verdict(False, [{"path": "", "message": f"the trainer's check did not "
                                    f"answer in {timeout:.0f} s; try again"}])
        except OSError as exc:
            return Verdict(False, [{"path": "", "message": f"cannot run the trainer's "
                                    f"check ({exc.strerror or exc})"}])
        stdout = done.stdout.decode("utf-8", errors="replace")
        stderr = done.stderr.decode("utf-8", errors="replace")
        runs = json_objects(stdout)
        errors = _status_errors(status) or problems_from(runs)
    if done.returncode == 0:
        return Verdict(True, [], notes_from(stderr), memory_from(runs))
    if not errors:  # it failed without saying why in its status file: its last line
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()),
                    f"exit code {done.returncode}")
        errors = [{"path": "", "message": f"the trainer's check failed: {last[-500:]}"}]
    return Verdict(False, errors, notes_from(stderr), memory_from(runs))


def _status_errors(path: Path) -> list[dict[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    errors = data.get("errors") if isinstance(data, dict) else None
    found = [e for e in errors or [] if isinstance(e, dict)
             and isinstance(e.get("path"), str) and isinstance(e.get("message"), str)]
    if not found and isinstance(data, dict) and isinstance(data.get("error"), str):
        found = [{"path": "", "message": data["error"]}]
    return [{"path": e["path"], "message": e["message"]} for e in found]
