"""`manager check [--json]`: is an update or a sync due? Quick, read-only, never waits
on the lock, never imports torch.

Exit codes (errors.py): 0 nothing due; 10 an update is available (the update runs the
sync too, so 10 wins when both are due); 11 a sync is due (dependencies out of sync or
migrations pending); an error's own code (1 and up) when the question cannot be
answered. Offline it says the remote was not reached and answers from the last fetch.
When the incoming commits add files where the user has files git does not track (which
`update` refuses on, exit 6), they are listed in `in_the_way` and as a problem with its
fix; the exit code stays 10.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from manager import __version__, envstatus, errors, migrations, repo
from manager.envstatus import SyncStatus
from manager.output import Result
from manager.paths import paths
from manager.repo import RepoStatus
from manager.state import load_state


@dataclass(frozen=True)
class Options:
    fetch: bool = True


def collision_problem(in_the_way: tuple[str, ...]) -> dict[str, str] | None:
    """What `update` would refuse on (manager.commands.update.collision_refusal)."""
    if not in_the_way:
        return None
    return {"problem": "the incoming commits add files where you have files git does not "
                       "track (ignored ones included); `update` refuses rather than "
                       f"overwrite them: {', '.join(in_the_way)}",
            "fix": "move or rename them, then run `python3 -m manager update`"}


def assess(st: RepoStatus, sync: SyncStatus, pending: list[str],
           in_the_way: tuple[str, ...] = ()) -> tuple[dict[str, Any], int]:
    """The report and the exit code; pure."""
    update_available = bool(st.behind)
    diverged = bool(st.behind) and bool(st.ahead)
    sync_due = not sync.in_sync or bool(pending)
    notes = list(st.notes)
    if diverged:
        notes.append(f"{st.branch} has diverged from {st.upstream} ({st.ahead} local commits): "
                     "update refuses until you merge or rebase")
    data: dict[str, Any] = {
        "version": __version__,
        "branch": st.branch,
        "commit": st.commit,
        "upstream": st.upstream,
        "upstream_commit": st.upstream_commit,
        "behind": st.behind,
        "ahead": st.ahead,
        "incoming": list(st.incoming),
        "dirty": st.dirty,
        "dirty_files": list(st.dirty_files),
        "remote_reached": st.remote_reached,
        "deps_in_sync": sync.in_sync,
        "deps_reasons": list(sync.reasons),
        "pending_migrations": pending,
        "update_available": update_available,
        "diverged": diverged,
        "sync_due": sync_due,
        "in_the_way": list(in_the_way),
        "problems": [p for p in (collision_problem(in_the_way),) if p],
        "notes": notes,
    }
    if update_available:
        code = errors.EXIT_UPDATE_AVAILABLE
    elif sync_due:
        code = errors.EXIT_SYNC_DUE
    else:
        code = errors.EXIT_OK
    return data, code


def run(options: Options) -> Result:
    p = paths()
    st = repo.status(p.root, fetch=options.fetch, timeout=repo.timeout_from_env())
    sync = envstatus.quick_status(p)  # looked up at call time: tests may replace it
    pending = migrations.pending(load_state(p).migrations)
    in_the_way: tuple[str, ...] = ()
    if st.behind and st.commit and st.upstream_commit:
        in_the_way = repo.in_the_way(p.root, st.commit, st.upstream_commit)
    data, code = assess(st, sync, pending, in_the_way)
    messages = ()
    if options.fetch and st.upstream and not st.remote_reached:
        messages = (f"aitk: note: the remote was not reached ({st.fetch_error}); "
                    "the answer is as of the last fetch",)
    return Result(data=data, exit_code=code, messages=messages)


def render(console: Console, data: Mapping[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()

    def row(key: str, value: object) -> None:
        table.add_row(key, "-" if value is None else str(value))

    row("version", data["version"])
    row("branch", data["branch"] or "(detached HEAD)")
    row("commit", (data["commit"] or "")[:10] or None)
    upstream = data["upstream"]
    if upstream:
        row("upstream", f"{upstream} {(data['upstream_commit'] or '')[:10]}".strip())
        reached = "reached" if data["remote_reached"] else "not reached (as of the last fetch)"
        row("remote", reached)
        row("behind / ahead", f"{_n(data['behind'])} / {_n(data['ahead'])}")
    else:
        row("upstream", None)
    row("dirty", ", ".join(data["dirty_files"]) if data["dirty"] else "no")
    deps = "yes" if data["deps_in_sync"] else "no: " + "; ".join(data["deps_reasons"])
    row("dependencies in sync", deps)
    row("pending migrations", ", ".join(data["pending_migrations"]) or "none")
    row("update available", "yes" if data["update_available"] else "no")
    console.print(table)
    if data["incoming"]:
        console.print("incoming:", markup=False)
        for line in data["incoming"]:
            console.print(f"  {line}", markup=False)
    for note in data["notes"]:
        console.print(f"note: {note}", markup=False)
    for problem in data["problems"]:
        console.print(f"problem: {problem['problem']}\n  fix: {problem['fix']}", markup=False)
    if data["problems"]:
        return  # each problem's fix says what to run
    if data["update_available"]:
        console.print("run `python3 -m manager update`", markup=False)
    elif envstatus.NOT_INSTALLED in data["deps_reasons"]:
        console.print("run ./install.sh (or `python3 -m manager install`)", markup=False)
    elif data["sync_due"]:
        console.print("run `python3 -m manager sync`", markup=False)


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)
