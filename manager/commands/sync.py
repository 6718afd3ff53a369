"""`manager sync`: bring .venv to exactly what spec.py says for this machine.

Plan (pure, plan.py) from the spec, the venv's metadata and the state; `--dry-run`
returns the plan; otherwise apply.py executes it. The cli layer holds the lock.

`answer_without_changes` is the same answer for a run that changes nothing (a dry run,
or nothing to do), read-only and without the lock as `check` asks: manager/noop_sync.py
gives it before the command line loads, so a no-op sync never imports rich, typer or
httpx (the renderer's plain lines need none of them).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manager import envvars, errors, runlog
from manager.envstatus import SKIP_TOOLS_ENV, gather
from manager.indexes import read_config
from manager.output import Result
from manager.paths import Paths, paths
from manager.plan import Plan, make_plan
from manager.running_jobs import job_refusal, running_jobs
from manager.specsource import current_spec
from manager.state import State, StateRead, read_state
from manager.venv import recover_interrupted_swap, swap_leftovers
from spec import Spec

if TYPE_CHECKING:
    from rich.console import Console

INSTALLER_ENV = "AITK_INSTALLER"  # "uv" or "pip": skip the automatic choice


@dataclass(frozen=True)
class Options:
    cpu: bool = False
    dry_run: bool = False
    force: bool = False
    verify: bool = False
    extra_requirements: tuple[str, ...] = ()  # e.g. requirements-test.txt for `test`
    log_name: str = "sync"  # logs/<log_name>-<time>.log

    def to_argv(self) -> list[str]:
        """The flags that reproduce these options (`update` re-executes sync with them)."""
        argv = []
        for flag, on in (("--cpu", self.cpu), ("--dry-run", self.dry_run),
                         ("--force", self.force), ("--verify", self.verify)):
            if on:
                argv.append(flag)
        return argv


def _say(message: str) -> None:
    print(f"aitk: {message}", file=sys.stderr, flush=True)


def choose_uv(where: Paths, needed: bool) -> Path | None:
    """uv when available (system or .uv/, provisioned when needed), pip otherwise."""
    from manager import tools

    forced = envvars.choice(INSTALLER_ENV, ("uv", "pip"))
    if forced == "pip":
        return None
    found = tools.find_uv(where)
    if found is None and (needed or forced == "uv"):
        found = tools.ensure_uv(where)
    if found is None and forced == "uv":
        raise errors.UsageError(f"{INSTALLER_ENV}=uv, but no uv is available",
                                hint=f"install uv, or unset {INSTALLER_ENV}")
    return found


def run(options: Options) -> Result:
    where = paths()
    if not options.dry_run:
        for note in recover_interrupted_swap(where):
            _say(note)
    read = read_state(where, keep_backup=not options.dry_run)
    messages: list[str] = []
    if read.problem:  # said first: the spec below may fail without the state's --cpu
        kept = f"; kept as {read.backup}" if read.backup else ""
        text = (f"the state file was unusable ({read.problem}){kept}; re-verifying instead "
                "of trusting it")
        _say(text)
        messages.append(f"aitk: {text}")
    cpu = options.cpu or read.state.cpu_requested
    spec = current_spec(cpu)
    inputs = gather(where, spec, read, extra_files=options.extra_requirements,
                    force=options.force, verify=options.verify)
    plan = make_plan(inputs)
    data = _data(options, spec, plan, read)
    if options.dry_run or plan.empty:
        _unchanged(where, data, spec, read.state)
        web_ui(where, options, data)
        return Result(data=data, messages=tuple(messages))
    messages += _job_check(where, options)
    from manager.apply import Context, apply  # only when there is work: keeps no-ops fast

    uv = choose_uv(where, needed=True)
    count = f"{len(plan.steps)} step{'' if len(plan.steps) == 1 else 's'}"
    with runlog.open_log(where, options.log_name) as log:
        shown = log.relative(where.root)
        _say(f"syncing .venv with {'uv' if uv else 'pip'} ({count})"
             + (f"; the installers' output goes to {shown}" if shown else ""))

        def report(line: str) -> None:
            _say(line)
            if log.path is not None:
                log.note(f"aitk: {line}")

        ctx = Context(paths=where, inputs=inputs, config=read_config(), uv=uv, report=report,
                      cpu_requested=cpu, log=log)
        applied = apply(plan, ctx)
        warnings = [*spec.warnings, *applied.warnings]
        if log.path is not None:
            _log_summary(log, applied.package_changes, warnings)
    data.update(in_sync=True, installer="uv" if uv else "pip", changes=list(applied.changes),
                package_changes=list(applied.package_changes), warnings=warnings,
                log=str(log.path) if log.path else None)
    _outcomes(data, applied.state)
    web_ui(where, options, data)
    return Result(data=data, messages=tuple(messages))


def answer_without_changes(options: Options) -> Result | None:
    """What `run` answers when it changes nothing (a dry run, or nothing to do), found
    read-only and without the lock; None when the run would change something (a plan
    step, a swap to recover, a state file to set aside, the web UI to build), and the
    full command (which holds the lock) must run."""
    where = paths()
    read = read_state(where, keep_backup=False)
    if read.problem or (not options.dry_run and swap_leftovers(where)):
        return None
    spec = current_spec(options.cpu or read.state.cpu_requested)
    plan = make_plan(gather(where, spec, read, extra_files=options.extra_requirements,
                            force=options.force, verify=options.verify))
    if not (options.dry_run or plan.empty):
        return None
    data = _data(options, spec, plan, read)
    _unchanged(where, data, spec, read.state)
    if ui_todo(where, options, data):
        return None
    return Result(data=data)


def _data(options: Options, spec: Spec, plan: Plan, read: StateRead) -> dict[str, Any]:
    return {
        "dry_run": options.dry_run,
        "spec": {"backend": spec.backend, "flavour": spec.flavour,
                 "torch": spec.torch.requirement, "torch_index_url": spec.torch_index_url,
                 "requirements_file": spec.requirements_file},
        "plan": [s.to_dict() for s in plan.steps],
        "state_problem": read.problem,
        "state_backup": str(read.backup) if read.backup else None,
    }


def _unchanged(where: Paths, data: dict[str, Any], spec: Spec, state: State) -> None:
    """The rest of the answer of a run that installs nothing."""
    from manager import tools

    uv = tools.find_uv(where) if os.environ.get(INSTALLER_ENV) != "pip" else None
    data.update(in_sync=not data["plan"], installer="uv" if uv else "pip", changes=[],
                package_changes=[], warnings=list(spec.warnings))
    _outcomes(data, state)


def _log_summary(log: runlog.RunLog, moved: Sequence[Mapping[str, Any]],
                 warnings: Sequence[str]) -> None:
    """What the terminal leaves out: the package-by-package changes."""
    log.note(f"{len(moved)} package(s) changed:")
    for row in moved:
        log.note(f"  {row['name']}: {row['before'] or '-'} -> {row['after'] or '-'}")
    for warning in warnings:
        log.note(f"warning: {warning}")


def _job_check(where: Paths, options: Options) -> list[str]:
    """Refuse (exit 7) to change packages under a running training job; with --force go
    ahead with a warning. A sync with nothing to do never gets here."""
    refusal = job_refusal(running_jobs(where.root), "a sync would change packages under it",
                          override="`sync --force`")
    if refusal is None:
        return []
    if not options.force:
        raise refusal
    text = f"warning: {refusal.message}; --force: syncing anyway"
    _say(text)
    return [f"aitk: {text}"]


def ui_todo(where: Paths, options: Options, data: dict[str, Any]) -> bool:
    """Record whether the web UI is out of date; True when this run would build it."""
    from manager import ui_build

    todo = ui_build.plan(ui_build.gather(where), options.force)
    data["ui"] = {"todo": not todo.empty, "reason": todo.reason, "changes": []}
    return not (todo.empty or options.dry_run or os.environ.get(SKIP_TOOLS_ENV) == "1")


def web_ui(where: Paths, options: Options, data: dict[str, Any]) -> None:
    """Build the web UI when its lockfile or sources changed (manager/ui_build.py). A
    failure is a warning: training works without it. Skipped with AITK_SKIP_TOOLS=1
    (it needs the local tools)."""
    from manager import ui_build

    if not ui_todo(where, options, data):
        return
    try:
        data["ui"]["changes"] = ui_build.ensure_built(where, _say, options.force)
        data["ui"]["todo"] = False
    except (ui_build.UiBuildError, errors.ManagerError, OSError) as exc:
        text = getattr(exc, "message", None) or str(exc)
        _say(f"warning: the web UI was not built: {text}")
        data.setdefault("warnings", []).append(f"the web UI was not built: {text}")


def _outcomes(data: dict[str, Any], state: Any) -> None:
    data["torch"] = dict(state.torch)
    data["companions"] = {k: dict(v) for k, v in state.companions.items()}
    data["optional"] = {k: dict(v) for k, v in state.optional.items()}


NEXT_LAUNCH = ("run `python3 -m manager launch` to open the web UI (`launch --example` "
               "trains the example job in the terminal)")


NOTHING_TO_DO = "Nothing to do: .venv matches the spec."


def render(console: Console, data: Mapping[str, Any], next_step: str = NEXT_LAUNCH) -> None:
    lines = unchanged_lines(data)
    if lines is None:
        # The steps were shown as they ran, and the installers' output is in the log:
        # here, each problem once (with its fix), then one line of what was made and next.
        lines = [*_ui_changes(data), *_warnings(data), summary_line(data, next_step)]
    for line in lines:
        console.print(line, markup=False)


def unchanged_lines(data: Mapping[str, Any]) -> list[str] | None:
    """What people read after a run that installed nothing (a dry run, or nothing to
    do), as plain lines; None after a run that applied a plan."""
    plan = data.get("plan") or []
    if data.get("dry_run"):
        if not plan:
            return [NOTHING_TO_DO]
        count = f"{len(plan)} step{'' if len(plan) == 1 else 's'}"
        return [f"Plan ({count}, nothing changed):",
                *(f"  {number}. {step['description']}" for number, step in enumerate(plan, 1))]
    if plan:
        return None
    return [*_ui_changes(data), NOTHING_TO_DO, *_not_in_use(data), *_warnings(data)]


def _ui_changes(data: Mapping[str, Any]) -> list[str]:
    return [f"  - {change}" for change in (data.get("ui") or {}).get("changes") or []]


def _warnings(data: Mapping[str, Any]) -> list[str]:
    return [f"warning: {warning}" for warning in data.get("warnings") or []]


def summary_line(data: Mapping[str, Any], next_step: str) -> str:
    changes = list(data.get("changes") or []) or ["nothing changed"]
    moved = len(data.get("package_changes") or [])
    if moved:
        changes.append(f"{moved} package{'' if moved == 1 else 's'} changed")
    return f"Done: .venv synced with {data.get('installer')} ({'; '.join(changes)}). " \
           f"Next: {next_step}."


def _not_in_use(data: Mapping[str, Any]) -> list[str]:
    """The optional packages and companions that are not installed, as an aligned table."""
    outcomes = {**(data.get("companions") or {}), **(data.get("optional") or {})}
    rows = [(name, str(record.get("status")),
             # First line only: records written by older versions hold whole tracebacks.
             (str(record.get("detail") or "").strip().splitlines() or [""])[0])
            for name, record in sorted(outcomes.items()) if record.get("status") != "ok"]
    if not rows:
        return []
    rows.insert(0, ("package", "outcome", "detail"))
    name_w, status_w = (max(len(row[i]) for row in rows) for i in (0, 1))
    return ["Optional packages not in use:",
            *(f"  {name:<{name_w}}  {status:<{status_w}}  {detail}".rstrip()
              for name, status, detail in rows)]
