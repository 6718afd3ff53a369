"""`manager doctor`: every check OK, WARN or FAIL, with the fix when not OK.

Exit 0 when nothing FAILs (WARNs included), 1 when any check FAILs. Never needs the
network, never waits on the manager's lock, and never hangs: each probe has a timeout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from manager.health import (
    checkout,
    hazards,
    install,
    interpreter,
    tooling,
    torchstack,
    webui,
)
from manager.health.check import Check, Probe, Status, redact_checks, run_probes, worst
from manager.output import Result
from manager.paths import Paths, paths

EXIT_FAILED = 1


@dataclass(frozen=True)
class Options:
    pass


def all_probes(where: Paths, environ: Mapping[str, str]) -> list[Probe]:
    """Every probe, in the order doctor lists them."""
    env = dict(environ)
    return [
        *interpreter.probes(where),
        *torchstack.probes(where),
        *install.probes(where),
        *tooling.probes(where),
        *webui.probes(where),
        *checkout.probes(where, env),
        *hazards.probes(where, env),
    ]


def summarize(checks: list[Check]) -> Result:
    counts = {s.value: sum(c.status is s for c in checks) for s in Status}
    data: dict[str, Any] = {
        "status": worst(checks).value,
        "counts": counts,
        "checks": [c.to_dict() for c in checks],
    }
    failed = counts[Status.FAIL.value] > 0
    return Result(data=data, exit_code=EXIT_FAILED if failed else 0)


def run(options: Options) -> Result:
    environ = dict(os.environ)
    checks = run_probes(all_probes(paths(), environ))
    # Redact against the caller's variables too (the bootstrap moved some aside).
    scrub = {**environ, **hazards.caller_environment(environ)}
    return summarize(redact_checks(checks, scrub))


_STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red"}


def render(console: Console, data: Mapping[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    # Wrapped, never cut: a long word (a path) folds onto the next line.
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    table.add_column(overflow="fold")
    for check in data["checks"]:
        status = check["status"]
        detail = check["detail"]
        if check.get("fix"):
            detail += f"\n  fix: {check['fix']}"
        table.add_row(f"[{_STYLE[status]}]{status}[/]", check["id"], detail)
    console.print(table, markup=True)
    counts = data["counts"]
    console.print(f"{counts['OK']} OK, {counts['WARN']} WARN, {counts['FAIL']} FAIL",
                  style=_STYLE[data["status"]])
