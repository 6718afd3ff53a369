"""(spec, what is installed, state) -> Plan. Pure: no I/O, no subprocesses.

An empty plan means the venv is what the spec asks for: that is `check`'s answer and a
no-op sync. `--dry-run` prints the plan; `sync` hands it to apply.py. The steps are in
the order they must run: the venv, the torch stack first, then the requirement files
under the torch constraints, git pins, local tools (an optional package may need one:
torchcodec loads FFmpeg), optional packages one at a time, verification, migrations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from manager.reqfiles import ReqFile
from manager.state import State
from manager.venv import Dist, Observed, normalize
from spec import Spec

INSTALLING = frozenset({"create-venv", "rebuild-venv", "install-torch", "install-companion",
                        "install-requirements", "reinstall-git-pin", "try-optional"})
_VERBS = {
    "create-venv": "create the virtual environment",
    "rebuild-venv": "rebuild the virtual environment",
    "install-torch": "install",
    "install-companion": "install",
    "install-requirements": "install the requirements of",
    "reinstall-git-pin": "reinstall",
    "try-optional": "try the optional package",
    "record-unavailable": "record as not available:",
    "verify": "verify the",
    "migrate": "apply migrations",
    "tools": "provision the",
}


@dataclass(frozen=True)
class Step:
    kind: str
    target: str
    reason: str
    force: bool = False  # replace the files even where the version already matches

    def describe(self) -> str:
        verb = _VERBS.get(self.kind, self.kind)
        text = f"{verb} {self.target}"
        if self.force and self.kind in INSTALLING:
            text += " (forced reinstall)"
        return f"{text}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "description": self.describe()}


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.steps

    def reasons(self) -> tuple[str, ...]:
        return tuple(s.describe() for s in self.steps)

    def kinds(self) -> tuple[str, ...]:
        return tuple(s.kind for s in self.steps)


@dataclass(frozen=True)
class Inputs:
    spec: Spec
    observed: Observed
    state: State
    requirement_files: tuple[ReqFile, ...]  # installed in this order
    requirements_hash: str
    machine: str = ""  # this machine's architecture, as Detection.arch says it
    state_problem: str | None = None
    pending_migrations: tuple[str, ...] = ()
    tools: bool = True
    # Tools found now among those a skipped optional package needs (see tools_wanted).
    tools_ready: frozenset[str] = frozenset()
    # Tools the last tools step skipped that would not be refused now (a new verifiable
    # pin, or the user's opt-in): worth provisioning again without --force.
    tools_unblocked: frozenset[str] = frozenset()
    # Tools the last tools step found or installed whose program is not there any more
    # (`rm -rf .node`): the state alone would call them provisioned.
    tools_gone: frozenset[str] = frozenset()
    force: bool = False
    verify: bool = False


def tools_skipped(state: State) -> set[str]:
    """The tools the last tools step skipped (refused: unverified, or no build here)."""
    return {name for name, r in state.tools.items() if r.get("status") == "skipped"}


def tools_recorded(state: State) -> dict[str, str]:
    """Tool name -> the program the last tools step used (installed or found)."""
    return {name: str(r["path"]) for name, r in state.tools.items()
            if r.get("status") in ("ok", "system") and r.get("path")}


def tools_wanted(state: State) -> set[str]:
    """The tools whose arrival makes a skipped optional package worth trying again."""
    return {str(t) for r in state.optional.values() if r.get("status") == "skipped"
            for t in r.get("needs") or ()}


def requirements_hash(spec: Spec, files: Mapping[str, str | None]) -> str:
    """Every requirement file that can apply, plus what in the spec changes the install."""
    digest = hashlib.sha256(spec.install_fingerprint().encode())
    for name in sorted(files):
        digest.update(f"\n{name}={files[name]}".encode())
    return digest.hexdigest()


def _same_arch(a: str, b: str) -> bool:
    alias = {"arm64": "aarch64", "amd64": "x86_64"}
    return alias.get(a.lower(), a.lower()) == alias.get(b.lower(), b.lower())


def venv_problem(inputs: Inputs) -> str | None:
    observed, spec = inputs.observed, inputs.spec
    if observed.python_version:
        try:
            if not SpecifierSet(spec.python).contains(observed.python_version,
                                                      prereleases=True):
                return f"its Python {observed.python_version} does not satisfy {spec.python}"
        except InvalidSpecifier:
            pass
    recorded = inputs.state.python.get("machine")
    if recorded and inputs.machine and not _same_arch(recorded, inputs.machine):
        return f"its Python is built for {recorded}, this machine is {inputs.machine}"
    return None


def _wheel_reason(have: Dist | None, pinned: str, force: bool) -> str | None:
    if have is None:
        return "not installed"
    if have.version != pinned:
        return f"{have.version} installed, {pinned} wanted"
    return "--force" if force else None


def make_plan(inputs: Inputs) -> Plan:
    spec, state, observed = inputs.spec, inputs.state, inputs.observed
    steps: list[Step] = []
    fresh = False
    if not observed.exists:
        steps.append(Step("create-venv", ".venv", "it does not exist yet"))
        fresh = True
    elif problem := venv_problem(inputs):
        steps.append(Step("rebuild-venv", ".venv", problem))
        fresh = True
    installed: Mapping[str, Dist] = {} if fresh else observed.dists
    spec_changed = state.spec_fingerprint != spec.install_fingerprint()

    stale_reason: str | None = None
    if not fresh:
        if inputs.state_problem:
            stale_reason = f"the state file was unusable ({inputs.state_problem})"
        elif state.venv_fingerprint is None:
            stale_reason = "no verified sync is recorded"
        elif state.venv_fingerprint != observed.fingerprint:
            stale_reason = "packages changed since the last verified sync"

    torch_have = installed.get(normalize(spec.torch.name))
    why = _wheel_reason(torch_have, spec.torch.pinned, inputs.force)
    if why:
        steps.append(Step("install-torch", spec.torch.requirement, why,
                          force=torch_have is not None))
    for wheel in spec.companions:
        have = installed.get(normalize(wheel.name))
        why = _wheel_reason(have, wheel.pinned, inputs.force)
        if not why:
            continue
        record = state.companions.get(wheel.name, {})
        known_bad = (have is None and not spec_changed and not fresh and not inputs.force
                     and record.get("version") == wheel.pinned
                     and record.get("status") in {"removed", "install_failed"})
        if not known_bad:
            steps.append(Step("install-companion", wheel.requirement, why,
                              force=have is not None))
    torch_touched = any(s.kind in {"install-torch", "install-companion"} for s in steps)

    for req in inputs.requirement_files:
        recorded = state.requirement_files.get(req.name)
        if fresh or recorded is None:
            why = "not installed yet"
        elif recorded != req.sha256:
            why = f"{req.name} changed"
        elif spec_changed:
            why = "the spec changed"
        elif state.requirements_hash != inputs.requirements_hash:
            # manager/requirements.txt pins constrain this pass, so they count too
            why = "the manager's pins or another requirement file changed"
        elif inputs.force:
            why = "--force"
        elif torch_touched:
            why = "the torch stack is being reinstalled"
        elif stale_reason:
            why = stale_reason
        else:
            why = None
        if why:
            steps.append(Step("install-requirements", req.name, why))
        for pin in req.git_pins:
            have = installed.get(pin.name)
            if have is None:
                continue  # the requirements pass installs it at the pinned revision
            now = have.vcs_revision
            if not _rev_matches(have, pin.rev) or state.git_pins.get(pin.name) != pin.rev:
                steps.append(Step("reinstall-git-pin", pin.line,
                                  f"pinned at {pin.rev}, installed at {now or 'unknown'}",
                                  force=True))

    # Local tools before the optional packages: torchcodec's import test needs FFmpeg.
    if inputs.tools and (not state.tools or inputs.force or inputs.tools_unblocked
                         or inputs.tools_gone):
        if not state.tools:
            why = "not provisioned yet"
        elif inputs.force:
            why = "--force"
        elif inputs.tools_gone:
            why = f"{', '.join(sorted(inputs.tools_gone))} provisioned before and gone now"
        else:
            why = f"{', '.join(sorted(inputs.tools_unblocked))} can be provisioned now"
        steps.append(Step("tools", "local tools", why))

    for opt in (*spec.extras, *spec.accelerators):
        record = state.optional.get(opt.name, {})
        if not opt.available:
            if record.get("status") != "unavailable" or record.get("detail") != opt.reason:
                steps.append(Step("record-unavailable", opt.name,
                                  opt.reason or "no build for this platform"))
            continue
        have = installed.get(normalize(opt.name))
        if fresh or not record or record.get("requirement") != opt.requirement:
            why = "not tried yet" if not record else "its requirement changed"
        elif inputs.force:
            why = "--force"
        elif spec_changed:
            why = "the spec changed"
        elif record.get("status") == "ok" and have is None:
            why = "it was installed and is gone"
        elif (record.get("status") == "skipped" and record.get("needs")
              and set(record["needs"]) <= inputs.tools_ready):
            why = f"{', '.join(record['needs'])} is available now"
        else:
            why = None
        if why:
            steps.append(Step("try-optional", opt.name, why))

    if inputs.verify:
        steps.append(Step("verify", "torch stack", "--verify"))
    elif stale_reason:
        steps.append(Step("verify", "torch stack", stale_reason))
    elif any(s.kind in INSTALLING for s in steps):
        steps.append(Step("verify", "torch stack", "after installing"))
    elif spec_changed:
        steps.append(Step("verify", "torch stack", "the spec changed"))

    if inputs.pending_migrations:
        steps.append(Step("migrate", ", ".join(inputs.pending_migrations), "not applied yet"))
    return Plan(tuple(steps))


def _rev_matches(dist: Dist, rev: str) -> bool:
    info = (dist.direct_url or {}).get("vcs_info")
    if not isinstance(info, dict):
        return False
    if info.get("requested_revision") == rev:
        return True
    commit = str(info.get("commit_id") or "")
    return bool(commit) and len(rev) >= 7 and commit.startswith(rev)

