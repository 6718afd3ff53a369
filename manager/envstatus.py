"""Is the venv in sync with the spec? Fast: never imports torch.

`quick_status` builds the same plan a sync would (plan.py) from cheap observations:
the venv's distribution metadata (directory listings), the requirement files' hashes,
the state file and the spec. In sync means the plan is empty. `check`, `launch` and
`doctor` call it; it never takes the lock and never writes.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass

from manager import errors, migrations
from manager.paths import Paths
from manager.plan import (
    Inputs,
    Plan,
    make_plan,
    requirements_hash,
    tools_recorded,
    tools_skipped,
    tools_wanted,
)
from manager.reqfiles import read_reqfile
from manager.state import StateRead, read_state
from manager.venv import observe
from spec import Spec

# Every file that can be the spec's requirements file, plus the manager's own pins (they
# constrain every pass): all of them feed the hash, so a change to any is noticed
# wherever the checkout is synced next.
REQUIREMENT_FILES = ("requirements.txt", "dgx_requirements.txt", "manager/requirements.txt")
SKIP_TOOLS_ENV = "AITK_SKIP_TOOLS"
NOT_INSTALLED = ("nothing is installed yet: run `python3 -m manager install`"
                 " (add --cpu on a machine without a GPU)")


@dataclass(frozen=True)
class SyncStatus:
    in_sync: bool
    reasons: tuple[str, ...] = ()  # why not, one line each, e.g. "requirements.txt changed"


def gather(paths: Paths, spec: Spec, read: StateRead, *, extra_files: Sequence[str] = (),
           force: bool = False, verify: bool = False) -> Inputs:
    """Cheap observations -> plan inputs. Missing required files are a ManagerError."""
    names = [spec.requirements_file, *[f for f in extra_files if f != spec.requirements_file]]
    files = tuple(read_reqfile(paths.root, name) for name in names)
    for req in files:
        if req.sha256 is None:
            raise errors.ManagerError(f"{req.path} is missing",
                                      hint="restore it with `git checkout -- " + req.name + "`")
    hashes = {name: read_reqfile(paths.root, name).sha256 for name in REQUIREMENT_FILES}
    machine = str(spec.detection_summary.get("arch") or platform.machine())
    return Inputs(
        spec=spec,
        observed=observe(paths),
        state=read.state,
        requirement_files=files,
        requirements_hash=requirements_hash(spec, hashes),
        machine=machine,
        state_problem=read.problem,
        pending_migrations=tuple(migrations.pending(read.state.migrations)),
        tools=os.environ.get(SKIP_TOOLS_ENV) != "1",
        tools_ready=_tools_ready(paths, tools_wanted(read.state)),
        tools_unblocked=_tools_unblocked(tools_skipped(read.state)),
        tools_gone=frozenset(name for name, program in tools_recorded(read.state).items()
                             if not os.path.exists(program)),
        force=force,
        verify=verify,
    )


def _tools_unblocked(skipped: set[str]) -> frozenset[str]:
    if not skipped:
        return frozenset()
    from manager import tools

    return frozenset(name for name in skipped if not tools.refused(name))


def _tools_ready(paths: Paths, wanted: set[str]) -> frozenset[str]:
    if not wanted:  # the usual case: nothing to look for, nothing imported
        return frozenset()
    from manager import tools

    return frozenset(name for name in wanted if tools.available(paths, name, probe=False))


def quick_status(paths: Paths, cpu: bool | None = None) -> SyncStatus:
    """cpu=None reuses the choice recorded in the state at install time."""
    from manager.specsource import current_spec

    read = read_state(paths, keep_backup=False)
    try:
        spec = current_spec(read.state.cpu_requested if cpu is None else cpu)
        plan: Plan = make_plan(gather(paths, spec, read))
    except errors.ManagerError as exc:
        if cpu is None and not paths.state_file.exists():
            # Nothing installed, so no recorded --cpu choice: say what to run instead
            # of a flag this caller (check, doctor, launch) does not have.
            return SyncStatus(False, (NOT_INSTALLED,))
        return SyncStatus(False, (exc.message,))
    return SyncStatus(plan.empty, plan.reasons())
