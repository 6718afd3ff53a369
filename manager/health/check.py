"""One doctor check, and running probes so that none can crash or hang doctor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from manager.health import secrets

OK = "OK"
WARN = "WARN"
FAIL = "FAIL"


class Status(str, Enum):
    OK = OK
    WARN = WARN
    FAIL = FAIL


@dataclass(frozen=True)
class Check:
    """One line of doctor: what was checked, how it went, and (when not OK) the fix."""

    id: str
    status: Status
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        # Doctor promises one line of detail: installer errors arrive multi-line. Never
        # cut: `--json` carries the whole detail, and a terminal wraps it.
        object.__setattr__(self, "detail", one_line(self.detail))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        return out


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def ok(id_: str, detail: str) -> Check:
    return Check(id_, Status.OK, detail)


def warn(id_: str, detail: str, fix: str | None) -> Check:
    return Check(id_, Status.WARN, detail, fix)


def fail(id_: str, detail: str, fix: str | None) -> Check:
    return Check(id_, Status.FAIL, detail, fix)


# Fixes named in several groups; one place to keep them in step with the CLI.
FIX_INSTALL = "python3 -m manager install  (or ./install.sh)"
FIX_SYNC = "python3 -m manager sync"
FIX_REPAIR = "python3 -m manager sync --verify"
FIX_REPORT = "report this with the output of `python3 -m manager doctor --json`"


@dataclass(frozen=True)
class Probe:
    """Gathers data and judges it. `ids` are the checks it reports, in order, so a
    probe that fails still yields one line per check (doctor --json lists every check)."""

    ids: tuple[str, ...]
    run: Callable[[], Sequence[Check]]
    timeout: float


def _could_not_check(ids: Iterable[str], why: str) -> list[Check]:
    return [warn(i, f"could not check: {why}", FIX_REPORT) for i in ids]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError):
        return "not implemented in this version"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_probes(probes: Sequence[Probe]) -> list[Check]:
    """Run every probe at once, each in a daemon thread with its own deadline.

    A probe that raises or overruns becomes "could not check" lines; daemon threads let
    doctor exit even if one is stuck in a call without a timeout of its own.
    """
    results: dict[int, list[Check]] = {}
    errors: dict[int, BaseException] = {}

    def target(index: int, probe: Probe) -> None:
        try:
            results[index] = list(probe.run())
        except BaseException as exc:  # noqa: BLE001 - isolation is the point
            errors[index] = exc

    threads = []
    start = time.monotonic()
    for index, probe in enumerate(probes):
        thread = threading.Thread(target=target, args=(index, probe), daemon=True,
                                  name=f"doctor-{probe.ids[0]}")
        thread.start()
        threads.append(thread)
    checks: list[Check] = []
    for index, (probe, thread) in enumerate(zip(probes, threads, strict=True)):
        thread.join(max(0.0, start + probe.timeout - time.monotonic()))
        if thread.is_alive():
            checks += _could_not_check(probe.ids, f"timed out after {probe.timeout:g}s")
        elif index in errors:
            checks += _could_not_check(probe.ids, _describe(errors[index]))
        else:
            checks += _complete(probe.ids, results.get(index, []))
    return checks


def _complete(ids: Sequence[str], got: list[Check]) -> list[Check]:
    """The probe's own lines, plus a line for any id it forgot to report."""
    seen = {c.id for c in got}
    missing = [i for i in ids if i not in seen]
    return got + _could_not_check(missing, "the probe reported nothing")


def worst(checks: Iterable[Check]) -> Status:
    statuses = {c.status for c in checks}
    for status in (Status.FAIL, Status.WARN):
        if status in statuses:
            return status
    return Status.OK


def redact_checks(checks: Iterable[Check], environ: Mapping[str, str]) -> list[Check]:
    """Last line of defence: no secret value from the environment leaves doctor."""
    values = secrets.secret_values(environ)
    return [
        Check(c.id, c.status, secrets.redact(c.detail, values),
              secrets.redact(c.fix, values) if c.fix else c.fix)
        for c in checks
    ]
