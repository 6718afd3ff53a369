"""`manager update [--auto] [--force] [--dry-run] [--cpu]`: fast-forward, then sync.

The order of questions (each a pure decision over a RepoStatus, see `decide`):
a running training job, a detached HEAD, no upstream, local changes, the remote not
reached, diverged history; otherwise fast-forward. With `--auto` (the launchers) every
refusal becomes a warning and the pull is skipped, so the launch still works.

After the pull, the freshly pulled code runs its own sync in a new process, built from
`Options.sync_argv()`, so every flag reaches it. `--dry-run` fetches, lists the incoming
commits, and asks the current code's `sync --dry-run` for its plan; it pulls nothing.

Nothing here resets, cleans or checks out: the only write to the working tree is git's
fast-forward, which git itself refuses when it would overwrite local work.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from manager import errors, lock, migrations, process, repo
from manager import running_jobs as running_jobs_mod
from manager.output import Result
from manager.paths import Paths, paths
from manager.repo import RepoStatus
from manager.running_jobs import RunningJob, running_jobs
from manager.state import load_state

_DIRTY_LISTED = 20


def _flag(name: str, forward: bool) -> Any:
    # metadata: the command-line flag, and whether the re-executed sync receives it.
    return field(default=False, metadata={"flag": name, "forward": forward})


@dataclass(frozen=True)
class Options:
    auto: bool = _flag("--auto", forward=False)
    force: bool = _flag("--force", forward=False)
    dry_run: bool = _flag("--dry-run", forward=True)
    cpu: bool = _flag("--cpu", forward=True)

    def to_argv(self) -> list[str]:
        """The flags that reproduce these options (`update` + to_argv() is this run)."""
        return [f.metadata["flag"] for f in fields(self) if getattr(self, f.name)]

    def sync_argv(self) -> list[str]:
        """`sync` and every flag it shares with update; a new field is forwarded by
        declaring it with forward=True, never by editing a list elsewhere."""
        return ["sync", *(f.metadata["flag"] for f in fields(self)
                          if f.metadata["forward"] and getattr(self, f.name))]


@dataclass(frozen=True)
class Decision:
    pull: bool  # fast-forward to the upstream commit
    warnings: tuple[str, ...] = ()
    refusal: errors.ManagerError | None = None  # raise this (not with --auto)


def interpreter(environ: Mapping[str, str] | None = None) -> str:
    """The Python that starts the new code. Normally the base interpreter, so the new
    code's own bootstrap checks its venv (a pull may change the manager's requirements);
    under AITK_NO_BOOTSTRAP=1 (tests, a prepared environment) this very interpreter."""
    env = os.environ if environ is None else environ
    if env.get("AITK_NO_BOOTSTRAP") == "1":
        return sys.executable
    base = getattr(sys, "_base_executable", None)
    return base if base and Path(base).exists() else sys.executable


def sync_command(options: Options) -> list[str]:
    return [interpreter(), "-m", "manager", *options.sync_argv()]


# --- the pure core ------------------------------------------------------------------------


def local_refusal(st: RepoStatus, options: Options) -> errors.ManagerError | None:
    """What stops an update before any network traffic."""
    if st.branch is None:
        at = st.commit[:10] if st.commit else "?"
        return errors.UpdateRefused(
            f"HEAD is detached at {at}: update follows a branch",
            hint="switch to your branch (`git switch main`), then run the update again")
    if st.upstream is None:
        return errors.UpdateRefused(
            f"branch {st.branch!r} tracks no upstream branch, so there is nothing to pull",
            hint=f"set one: `git branch --set-upstream-to=origin/main {st.branch}`")
    if st.dirty_files and not options.force:
        return dirty_error(st.dirty_files)
    return None


def dirty_error(files: tuple[str, ...]) -> errors.DirtyTree:
    shown = list(files[:_DIRTY_LISTED])
    if len(files) > _DIRTY_LISTED:
        shown.append(f"... and {len(files) - _DIRTY_LISTED} more")
    listing = "".join(f"\n  {name}" for name in shown)
    return errors.DirtyTree(
        f"local changes to tracked files; the update would touch them:{listing}",
        hint="commit them (`git commit -am ...`) or stash them (`git stash`), then run "
             "the update again; `--force` tries anyway and git refuses if a file would "
             "be overwritten")


def collision_refusal(paths_in_the_way: tuple[str, ...]) -> errors.DirtyTree | None:
    """The incoming commits add files where the user has files git does not track
    (ignored outputs and logs included): git would overwrite the ignored ones silently."""
    if not paths_in_the_way:
        return None
    shown = list(paths_in_the_way[:_DIRTY_LISTED])
    if len(paths_in_the_way) > _DIRTY_LISTED:
        shown.append(f"... and {len(paths_in_the_way) - _DIRTY_LISTED} more")
    listing = "".join(f"\n  {name}" for name in shown)
    return errors.DirtyTree(
        "the incoming commits add files where you have files git does not track "
        f"(ignored ones included); the update would overwrite them:{listing}",
        hint="move or rename them, then run the update again; nothing was changed")


def remote_refusal(st: RepoStatus) -> errors.ManagerError | None:
    """What stops an update once the remote was asked."""
    if st.fetch_error is not None:
        return errors.ManagerError(
            f"could not fetch from the remote {st.remote!r}: {st.fetch_error}",
            hint="check the network (and the proxy settings), or run `update --auto` to "
                 f"sync without pulling; {repo.TIMEOUT_ENV} sets the timeout in seconds")
    if st.upstream_commit is None:
        return errors.UpdateRefused(f"{st.upstream} does not exist on the remote",
                                    hint="set another upstream with "
                                         "`git branch --set-upstream-to=...`")
    if (st.ahead or 0) > 0 and (st.behind or 0) > 0:
        return errors.UpdateRefused(
            f"{st.branch!r} and {st.upstream} have diverged ({st.ahead} local and "
            f"{st.behind} incoming commits): a fast-forward is not possible",
            hint=f"merge or rebase yourself (`git pull --rebase`), or reset {st.branch!r} "
                 "if the local commits are not needed")
    return None


def decide(refusal: errors.ManagerError | None, st: RepoStatus | None,
           options: Options) -> Decision:
    if refusal is not None:
        if options.auto:
            return Decision(pull=False, warnings=(f"update skipped: {refusal.message}",))
        return Decision(pull=False, refusal=refusal)
    warnings: tuple[str, ...] = ()
    if st is not None and st.dirty_files and options.force:
        warnings = ("local changes present; --force: git refuses the fast-forward if it "
                    "would overwrite them",)
    pull = st is not None and (st.behind or 0) > 0
    return Decision(pull=pull, warnings=warnings)


def job_refusal(jobs: list[RunningJob]) -> errors.UpdateRefused | None:
    return running_jobs_mod.job_refusal(jobs, "updating would swap code under it")


# --- the shell ----------------------------------------------------------------------------


def run(options: Options) -> Result:
    p = paths()
    refusal = job_refusal(running_jobs(p.root))
    if refusal is not None:
        if options.auto:  # a sync would swap packages under the job too: skip both
            return _result(options, None, pulled=False, sync=None,
                           warnings=(f"update and sync skipped: {refusal.message}",))
        raise refusal
    # The lock covers the git phase only: the sync below is a new process that takes it.
    with lock.hold(p, "update"):
        st, decision = _assess(p, options)
        if decision.refusal is not None:
            raise decision.refusal
        pulled = False
        warnings = decision.warnings
        target = st.upstream_commit if st is not None else None
        if decision.pull and target and not options.dry_run:
            try:
                repo.fast_forward(p.root, target)
                pulled = True
            except errors.ManagerError as exc:  # git itself refused (a merge in progress)
                if not options.auto:
                    raise
                warnings += (f"update skipped: {exc.message}",)
    completed = process.run(sync_command(options), cwd=p.root, capture=False)
    return _result(options, st, pulled=pulled, sync=completed, warnings=warnings,
                   would_pull=decision.pull and (pulled or options.dry_run))


def _assess(p: Paths, options: Options) -> tuple[RepoStatus | None, Decision]:
    try:
        local = repo.status(p.root)
    except errors.ManagerError as exc:  # not a git checkout (a zip download), no git
        return None, decide(exc, None, options)  # --auto: warn, still sync
    refusal = local_refusal(local, options)
    if refusal is not None:
        return local, decide(refusal, local, options)
    st = repo.status(p.root, fetch=True, timeout=repo.timeout_from_env())
    refusal = remote_refusal(st)
    if refusal is None and st.commit and st.upstream_commit and (st.behind or 0) > 0:
        refusal = collision_refusal(repo.in_the_way(p.root, st.commit, st.upstream_commit))
    return st, decide(refusal, st, options)


def _result(options: Options, st: RepoStatus | None, *, pulled: bool,
            sync: process.Completed | None, warnings: tuple[str, ...],
            would_pull: bool = False) -> Result:
    moving = st is not None and (pulled or would_pull)
    data: dict[str, Any] = {
        "dry_run": options.dry_run,
        "branch": st.branch if st else None,
        "upstream": st.upstream if st else None,
        "from": st.commit if st else None,
        "to": (st.upstream_commit if moving else st.commit) if st else None,
        "would_pull": would_pull and options.dry_run,
        "pulled": pulled,
        "behind": st.behind if st else None,
        "incoming": list(st.incoming) if st and moving else [],
        "dirty_files": list(st.dirty_files) if st else [],
        "remote_reached": st.remote_reached if st else False,
        "sync_argv": list(sync.argv) if sync else None,
        "sync_exit_code": sync.returncode if sync else None,
        "warnings": list(warnings),
    }
    if options.dry_run:
        after = replace(options, dry_run=False).sync_argv()
        data["sync_after_pull"] = ["python3", "-m", "manager", *after]
        try:
            applied = load_state(paths()).migrations
        except errors.StateError:
            applied = []
        data["pending_migrations"] = migrations.describe(migrations.pending(applied))
    messages = tuple(f"aitk: warning: {w}" for w in warnings)
    code = 0
    if sync is not None and not sync.ok:
        code = sync.returncode if sync.returncode > 0 else 1
        which = "sync --dry-run" if options.dry_run else "the sync after the update"
        messages += (f"aitk: error: {which} failed (exit {sync.returncode})",
                     "aitk: hint: fix the cause above and run "
                     f"`python3 -m manager {' '.join(options.sync_argv())}`")
    return Result(data=data, exit_code=code, messages=messages)


def render(console: Console, data: Mapping[str, Any]) -> None:
    incoming = data.get("incoming") or []
    if data.get("dry_run"):
        if data.get("would_pull"):
            console.print(f"would fast-forward {data['branch']} to {data['upstream']} "
                          f"({data['behind']} incoming commits):", markup=False)
            for line in incoming:
                console.print(f"  {line}", markup=False)
            console.print(f"then: {' '.join(data['sync_after_pull'])} (the new code's)",
                          markup=False)
        else:
            console.print("would pull nothing", markup=False)
        pending = data.get("pending_migrations") or {}
        if pending:
            console.print("pending migrations (the sync applies them):", markup=False)
            for mid, what in pending.items():
                console.print(f"  {mid}: {what}", markup=False)
        console.print("dry run: nothing was pulled", markup=False)
        return
    if data.get("pulled"):
        console.print(f"updated {data['branch']}: {str(data['from'])[:10]} -> "
                      f"{str(data['to'])[:10]} ({data['behind']} commits)", markup=False)
    elif data.get("branch") and data.get("sync_argv") is not None:
        console.print(f"{data['branch']} is up to date" if not data.get("warnings")
                      else "not pulled (see the warnings)", markup=False)
