"""Runs a Plan: the only part of the sync that changes anything.

The state is marked unverified before the first change and rewritten only after the
final verification, so an interruption at any point (Ctrl+C, kill -9) leaves a state
that makes the next sync re-verify, and that sync reaches the same verified state.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from manager import disk, errors, process, torchstack
from manager import venv as venvmod
from manager.indexes import IndexConfig
from manager.installer import Installer, Outcome, PipInstaller, Request, UvInstaller
from manager.paths import Paths
from manager.plan import Inputs, Plan, Step
from manager.runlog import RunLog
from manager.state import State, save_state
from spec import Optional_, Spec, Wheel

Report = Callable[[str], None]


@dataclass
class Context:
    paths: Paths
    inputs: Inputs
    config: IndexConfig
    uv: Path | None  # None: use pip
    report: Report
    cpu_requested: bool = False
    # Installer output and detail (tracebacks): a log file, so the terminal keeps one
    # line per step; report() lines go to the terminal (the caller copies them here too).
    log: RunLog = field(default_factory=lambda: RunLog(sys.stderr, None))
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    torch_source_used: str | None = None

    @property
    def spec(self) -> Spec:
        return self.inputs.spec

    @property
    def constraints(self) -> Path:
        return self.paths.venv / "aitk_constraints.txt"

    def installer(self) -> Installer:
        python = self.paths.venv_python
        if self.uv is not None:
            return UvInstaller(self.uv, python, self.config, echo=self.log.stream)
        return PipInstaller(python, echo=self.log.stream)

    def see_output(self) -> str:
        """The hint of an installer failure: where its whole output is."""
        where = self.log.relative(self.paths.root)
        return f"the installer's output is in {where}" if where else \
            "see the installer output above"

    def disk_full(self, what: str, output: str) -> errors.ManagerError | None:
        """The error naming the full disk when the installer's output says the disk is
        full (it reads like an index or download problem otherwise); else None."""
        if not disk.out_of_space(output):
            return None
        installer = "uv" if self.uv is not None else "pip"
        where = disk.full_disk(output, disk.install_places(self.paths.venv, installer))
        return errors.ManagerError(disk.message(what, where),
                                   hint=disk.hint(installer, where, self.see_output()))


@dataclass(frozen=True)
class Applied:
    state: State
    changes: tuple[str, ...]
    warnings: tuple[str, ...]
    package_changes: tuple[dict[str, str | None], ...]


def apply(plan: Plan, ctx: Context) -> Applied:
    state = ctx.inputs.state
    before = {} if not ctx.inputs.observed.exists else {
        n: d.version for n, d in ctx.inputs.observed.dists.items()}
    if ctx.paths.venv.exists():
        _mark_unverified(ctx.paths, state)
    stack_pending = False  # the torch stack was installed and not yet verified
    total = len(plan.steps)
    for number, step in enumerate(plan.steps, 1):
        if stack_pending and step.kind not in _STACK_STEPS:
            guard(ctx, state)  # verify torch before anything else is installed over it
            stack_pending = False
        ctx.report(f"[{number}/{total}] {step.describe()}")
        _RUNNERS[step.kind](ctx, state, step)
        if step.kind in {"create-venv", "rebuild-venv"}:
            _mark_unverified(ctx.paths, state)
        stack_pending = stack_pending or step.kind in {"install-torch", "install-companion"}
    if stack_pending:
        guard(ctx, state)
    after = venvmod.observe(ctx.paths)
    _record_verified(ctx, state, after)
    save_state(ctx.paths, state)
    diff = _diff(before, {n: d.version for n, d in after.dists.items()})
    return Applied(state, tuple(ctx.changes), tuple(ctx.warnings), tuple(diff))


_STACK_STEPS = frozenset({"create-venv", "rebuild-venv", "install-torch", "install-companion"})


def _mark_unverified(paths: Paths, state: State) -> None:
    state.venv_fingerprint = None
    save_state(paths, state)


def _record_verified(ctx: Context, state: State, after: venvmod.Observed) -> None:
    spec = ctx.spec
    state.cpu_requested = ctx.cpu_requested
    state.backend = spec.backend
    state.installer = "uv" if ctx.uv else "pip"
    state.spec_fingerprint = spec.install_fingerprint()
    state.requirements_hash = ctx.inputs.requirements_hash
    for req in ctx.inputs.requirement_files:
        if req.sha256:
            state.requirement_files[req.name] = req.sha256
        for pin in req.git_pins:
            if pin.name in after.dists:
                state.git_pins[pin.name] = pin.rev
    state.venv_fingerprint = after.fingerprint
    state.python = {"version": after.python_version or "",
                    "machine": ctx.inputs.machine or platform.machine()}
    state.verified_at = time.time()


def _diff(before: dict[str, str], after: dict[str, str]) -> list[dict[str, str | None]]:
    out = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            out.append({"name": name, "before": before.get(name), "after": after.get(name)})
    return out


# ---- the venv --------------------------------------------------------------------------


def _find_python(spec_python: str) -> str | None:
    """An interpreter satisfying the spec's Python range, for the venv module."""
    from packaging.specifiers import SpecifierSet

    wanted = SpecifierSet(spec_python)
    base = getattr(sys, "_base_executable", sys.executable)
    candidates = [base, sys.executable]
    candidates += [f"python3.{minor}" for minor in range(20, 9, -1)]
    for candidate in candidates:
        exe = shutil.which(candidate) if os.sep not in candidate else candidate
        if not exe:
            continue
        done = process.run([exe, "-c", "import platform;print(platform.python_version())"],
                           timeout=30)
        if done.ok and wanted.contains(done.stdout.strip(), prereleases=True):
            return exe
    return None


def _create_venv(ctx: Context, target: Path) -> None:
    spec_python = ctx.spec.python
    if ctx.uv is not None:
        env = {"UV_PYTHON_INSTALL_DIR": str(ctx.paths.uv_dir / "python")}
        # Built aside: the prompt names the folder it becomes, not `.venv.build`.
        argv = [str(ctx.uv), "venv", "--seed", "--python", spec_python,
                "--prompt", ctx.paths.venv.name, str(target)]
        done = process.run(argv, extra_env=env, echo=ctx.log.stream)
    else:
        python = _find_python(spec_python)
        if python is None:
            raise errors.ManagerError(
                f"no Python satisfying {spec_python} was found for {target.name}",
                hint="install a matching Python, or install uv so the manager can fetch one")
        done = process.run([python, "-m", "venv", "--prompt", ctx.paths.venv.name,
                            str(target)], echo=ctx.log.stream)
    if not done.ok:
        shutil.rmtree(target, ignore_errors=True)
        raise ctx.disk_full(f"creating {target.name}", done.stdout) or errors.ManagerError(
            f"creating {target.name} failed: {done.stdout.strip()[-300:]}",
            hint=ctx.see_output())


def _run_create(ctx: Context, state: State, step: Step) -> None:
    # Built aside and renamed into place, like a rebuild: a kill mid-creation leaves no
    # half-made .venv (recover_interrupted_swap drops the debris), and a .venv folder
    # without a Python (nothing usable in it) is replaced instead of blocking `uv venv`.
    build = venvmod.build_aside(ctx.paths)
    shutil.rmtree(build, ignore_errors=True)
    _create_venv(ctx, build)
    venvmod.retarget_scripts(build, ctx.paths.venv)
    venvmod.swap_in(ctx.paths)
    ctx.changes.append("created .venv")


def _run_rebuild(ctx: Context, state: State, step: Step) -> None:
    build = venvmod.build_aside(ctx.paths)
    shutil.rmtree(build, ignore_errors=True)
    _create_venv(ctx, build)
    inside = _running_inside(ctx.paths.venv)
    if inside:
        # This process runs from the old venv: give the new one the manager's own
        # dependencies before the swap, then continue in it.
        manager_reqs = Path(__file__).resolve().parent / "requirements.txt"
        python = _venv_python(build)
        installer = (UvInstaller(ctx.uv, python, ctx.config, echo=ctx.log.stream) if ctx.uv
                     else PipInstaller(python, echo=ctx.log.stream))
        _check(ctx, installer.install(Request(requirement_files=(manager_reqs,))),
               "installing the manager's own dependencies into the new .venv")
        marker = ctx.paths.venv / "aitk_bootstrap.txt"  # the bootstrap's "deps are in"
        if marker.exists():
            shutil.copy2(marker, build / marker.name)
    venvmod.retarget_scripts(build, ctx.paths.venv)
    venvmod.swap_in(ctx.paths)
    state.companions.clear()
    state.optional.clear()
    state.requirement_files.clear()
    state.git_pins.clear()
    ctx.changes.append(f"rebuilt .venv ({step.reason})")
    if inside and not os.environ.get("AITK_REBUILT"):
        _mark_unverified(ctx.paths, state)
        ctx.report("continuing in the rebuilt .venv")
        python = str(ctx.paths.venv_python)
        os.environ["AITK_REBUILT"] = "1"
        os.execv(python, [python, "-m", "manager", *sys.argv[1:]])


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _running_inside(venv: Path) -> bool:
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


# ---- the torch stack -------------------------------------------------------------------


def index_problem(url: str, timeout: float = 15.0) -> str | None:
    """None when the index serves a torch project page; else why not."""
    if url.startswith("file:"):
        from urllib.parse import urlparse
        from urllib.request import url2pathname

        folder = Path(url2pathname(urlparse(url).path)) / "torch"
        return None if folder.exists() else f"{folder} does not exist"
    import httpx

    try:
        response = httpx.get(url.rstrip("/") + "/torch/", timeout=timeout,
                             follow_redirects=True)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if response.status_code != 200:
        return f"HTTP {response.status_code}"
    return None


def install_wheel(ctx: Context, wheel: Wheel, force: bool, deps: bool = True) -> Outcome:
    """Install one exact build from the spec's index, or only that build from the
    configured sources when the index cannot be reached.

    A forced install replaces this wheel's own files only (--no-deps), then a plain
    install adds any dependency that is missing: forcing with dependencies would also
    reinstall the libraries torch shares with the manager itself (filelock), and another
    manager run importing them at that moment crashes (issue 14)."""
    if force and deps:
        outcome = install_wheel(ctx, wheel, force=True, deps=False)
        return install_wheel(ctx, wheel, force=False, deps=True) if outcome.ok else outcome
    installer = ctx.installer()
    torchstack.write_constraints(ctx.spec, ctx.constraints)
    url = ctx.spec.torch_index_url
    request = Request(requirements=(wheel.requirement,), constraints=(ctx.constraints,),
                      force_reinstall=force, no_deps=not deps)
    if url:
        if ctx.torch_source_used is None:
            problem = index_problem(url)
            if problem:
                ctx.log.note(f"the PyTorch index {url} cannot be reached ({problem}); looking "
                             f"for exactly {wheel.requirement} in the configured indexes "
                             f"and find-links")
                ctx.warnings.append(f"PyTorch index {url} unreachable ({problem}); used "
                                    f"the configured indexes and find-links (to use another "
                                    f"copy of that index, set AITK_TORCH_INDEX_URL)")
                ctx.torch_source_used = "configured"
            else:
                ctx.torch_source_used = url
        if ctx.torch_source_used == url:
            return installer.install(dataclasses.replace(request, index_url=url))
    ctx.torch_source_used = ctx.torch_source_used or "configured"
    outcome = installer.install(request)
    if not outcome.ok and url and ctx.torch_source_used == "configured":
        outcome = Outcome(False, outcome.output + (
            f"\n{wheel.requirement} is not in the configured indexes or find-links, "
            f"and the PyTorch index {url} could not be reached"))
    return outcome


def _torch_error(ctx: Context, wheel: Wheel, outcome: Outcome) -> errors.ManagerError:
    full = ctx.disk_full(f"installing {wheel.requirement}", outcome.output)
    if full is not None:  # before the index: a full disk is not a missing build
        return full
    url = ctx.spec.torch_index_url
    if url and ctx.torch_source_used == "configured":
        return errors.ManagerError(
            f"cannot install {wheel.requirement}: the PyTorch index {url} could not be "
            f"reached, and the configured indexes and find-links ({ctx.config.describe()}) "
            f"do not have exactly that build",
            hint="set AITK_TORCH_INDEX_URL to a reachable mirror of that index (or `pypi` "
                 "to use your configured indexes), or put the wheel in a find-links folder")
    return errors.ManagerError(f"installing {wheel.requirement} failed: {outcome.last_line()}",
                               hint=ctx.see_output())


def _run_torch(ctx: Context, state: State, step: Step) -> None:
    wheel = ctx.spec.torch
    outcome = install_wheel(ctx, wheel, force=step.force)
    if not outcome.ok:
        raise _torch_error(ctx, wheel, outcome)
    ctx.changes.append(f"installed {wheel.name} {wheel.pinned}")


def _companion(ctx: Context, name: str) -> Wheel:
    return next(w for w in ctx.spec.companions if w.requirement == name or w.name == name)


def _run_companion(ctx: Context, state: State, step: Step) -> None:
    wheel = _companion(ctx, step.target)
    outcome = install_wheel(ctx, wheel, force=step.force)
    if outcome.ok:
        ctx.changes.append(f"installed {wheel.name} {wheel.pinned}")
        return
    if wheel.required or disk.out_of_space(outcome.output):  # nothing fits after it either
        raise _torch_error(ctx, wheel, outcome)
    detail = outcome.last_line()
    url = ctx.spec.torch_index_url
    if url and ctx.torch_source_used == "configured":
        # The installer's own line misleads here (pip calls a missing build a
        # "conflict" when a constraint names it); its full output is above.
        detail = (f"the PyTorch index {url} could not be reached, and the configured "
                  f"indexes and find-links do not have exactly that build")
    state.companions[wheel.name] = {"status": "install_failed", "version": wheel.pinned,
                                    "detail": detail}
    ctx.warnings.append(f"{wheel.name} {wheel.pinned} could not be installed ({detail}); "
                        f"the trainer does not need it")


def guard(ctx: Context, state: State, deep: bool = False) -> None:
    """Verify the torch stack by importing it; repair by a forced reinstall; a companion
    that still fails is removed and recorded; torch failing is an error."""
    python = ctx.paths.venv_python
    if deep:
        _repair_incomplete(ctx)
    present = venvmod.observe(ctx.paths).dists
    wheels = [ctx.spec.torch] + [w for w in ctx.spec.companions
                                 if venvmod.normalize(w.name) in present]
    problems = torchstack.verify(python, wheels)
    for wheel in wheels:
        problem = problems.get(wheel.name)
        if problem is None:
            _record_wheel(state, wheel, ctx.spec)
            continue
        ctx.log.note(f"{wheel.name} is broken: {problem}")  # the terminal says it once, below
        ctx.report(f"{wheel.name} does not import; reinstalling {wheel.pinned}, forced")
        outcome = install_wheel(ctx, wheel, force=True, deps=False)
        again = torchstack.verify(python, [ctx.spec.torch, wheel] if wheel is not ctx.spec.torch
                                  else [wheel]).get(wheel.name)
        if outcome.ok and again is None:
            ctx.changes.append(f"repaired {wheel.name} {wheel.pinned}")
            _record_wheel(state, wheel, ctx.spec)
            continue
        found = again or outcome.last_line()
        if wheel is ctx.spec.torch or wheel.required:
            raise errors.ManagerError(
                f"{wheel.name} {wheel.pinned} does not work in .venv after a forced "
                f"reinstall: {found}",
                hint="run `python3 -m manager doctor`; deleting .venv and installing again "
                     "starts from scratch")
        ctx.installer().uninstall([wheel.name])
        state.companions[wheel.name] = {"status": "removed", "version": wheel.pinned,
                                        "detail": found}
        ctx.changes.append(f"removed {wheel.name}")  # why: the warning below says it
        ctx.warnings.append(f"{wheel.name} {wheel.pinned} was removed: it does not import "
                            f"({found}); the trainer does not need it")


def _record_wheel(state: State, wheel: Wheel, spec: Spec) -> None:
    record = {"status": "ok", "version": wheel.pinned}
    if wheel is spec.torch or wheel.name == spec.torch.name:
        state.torch = {"name": wheel.name, **record}
    else:
        state.companions[wheel.name] = record


def _repair_incomplete(ctx: Context) -> None:
    observed = venvmod.observe(ctx.paths)
    for leftover in venvmod.stray_install_leftovers(observed):
        shutil.rmtree(leftover, ignore_errors=True)
        ctx.report(f"removed {leftover.name}, left by an interrupted install")
    stack = {venvmod.normalize(w.name): w for w in (ctx.spec.torch, *ctx.spec.companions)}
    for name in venvmod.incomplete_dists(observed):
        dist = observed.dists[name]
        ctx.report(f"{name} {dist.version} is incomplete (files missing); reinstalling, forced")
        if name in stack:
            outcome = install_wheel(ctx, stack[name], force=True, deps=False)
        else:
            outcome = ctx.installer().install(Request(
                requirements=(f"{name}=={dist.version}",), constraints=(ctx.constraints,),
                force_reinstall=True, no_deps=True))
        _check(ctx, outcome, f"reinstalling the incomplete {name} {dist.version}")
        ctx.changes.append(f"repaired incomplete {name} {dist.version}")


def _run_verify(ctx: Context, state: State, step: Step) -> None:
    guard(ctx, state, deep=True)


# ---- requirements, git pins, optional packages -----------------------------------------


def _check(ctx: Context, outcome: Outcome, what: str) -> None:
    if not outcome.ok:
        raise ctx.disk_full(what, outcome.output) or errors.ManagerError(
            f"{what} failed: {outcome.last_line()}", hint=ctx.see_output())


def _run_requirements(ctx: Context, state: State, step: Step) -> None:
    req = next(r for r in ctx.inputs.requirement_files if r.name == step.target)
    torchstack.write_constraints(ctx.spec, ctx.constraints)
    outcome = ctx.installer().install(
        Request(requirement_files=(req.path,), constraints=(ctx.constraints,)))
    _check(ctx, outcome, f"installing {req.name}")
    ctx.changes.append(f"installed the requirements of {req.name}")
    guard(ctx, state)


def _run_git_pin(ctx: Context, state: State, step: Step) -> None:
    outcome = ctx.installer().install(Request(
        requirements=(step.target,), constraints=(ctx.constraints,), force_reinstall=True,
        no_deps=True))
    _check(ctx, outcome, f"reinstalling {step.target}")
    ctx.changes.append(f"reinstalled {step.target}")
    guard(ctx, state)


def _optional(ctx: Context, name: str) -> Optional_:
    return next(o for o in (*ctx.spec.extras, *ctx.spec.accelerators) if o.name == name)


def _missing_tools(ctx: Context, needs: tuple[str, ...]) -> list[str]:
    from manager import tools

    return [name for name in needs if not tools.available(ctx.paths, name)]


def _run_optional(ctx: Context, state: State, step: Step) -> None:
    opt = _optional(ctx, step.target)
    missing = _missing_tools(ctx, opt.needs)
    if missing:
        # Installing it would only prove what is known (torchcodec cannot load without
        # FFmpeg's libraries): skip it, and let the plan try again once the tool is here.
        from manager.tools import package_need

        names = ", ".join(package_need(name) for name in missing)
        detail = f"needs {names}, which is not available here"
        state.optional[opt.name] = {"requirement": opt.requirement, "kind": opt.kind,
                                    "status": "skipped", "detail": detail,
                                    "needs": list(opt.needs)}
        ctx.warnings.append(f"{opt.name} skipped: it {detail}; once {names} is there "
                            f"(see the {', '.join(missing)} line, or `python3 -m manager "
                            f"doctor`), the next `python3 -m manager sync` installs it")
        return
    installer = ctx.installer()
    before = {n: d.version for n, d in venvmod.observe(ctx.paths).dists.items()}
    torchstack.write_constraints(ctx.spec, ctx.constraints)
    outcome = installer.install(Request(requirements=(opt.requirement,),
                                        constraints=(ctx.constraints,)))
    record = {"requirement": opt.requirement, "kind": opt.kind}
    full = None if outcome.ok else ctx.disk_full(f"installing {opt.requirement}", outcome.output)
    if full is not None:  # not this package's fault: the next one would fail the same way
        raise full
    if not outcome.ok:
        detail = outcome.last_line()
        state.optional[opt.name] = {**record, "status": "install_failed", "detail": detail}
        ctx.warnings.append(f"{opt.name} could not be installed ({detail}); continuing "
                            "without it")
        return
    from manager import tools

    # Tested as the trainer will run it: launched with the local tools' environment (a
    # library path only works from a process's start), e.g. torchcodec finding .ffmpeg/.
    check = torchstack.import_modules(ctx.paths.venv_python, [opt.import_name],
                                      extra_env=tools.child_env(ctx.paths))
    result = check.get(opt.import_name)
    if result is not None and result.ok:
        state.optional[opt.name] = {**record, "status": "ok", "detail": ""}
        ctx.changes.append(f"installed {opt.name}")
        guard(ctx, state)
        return
    detail = result.summary if result else "not checked"
    if result is not None and result.error != detail:
        ctx.log.note(f"importing {opt.import_name} failed:\n{result.error}")  # the whole story
    _roll_back(ctx, installer, before, venvmod.normalize(opt.name))
    state.optional[opt.name] = {**record, "status": "rolled_back", "detail": detail}
    ctx.warnings.append(f"{opt.name} was rolled back: it does not import ({detail})")
    guard(ctx, state)


def _roll_back(ctx: Context, installer: Installer, before: dict[str, str], name: str) -> None:
    """Undo an optional package's install: remove what it added and put back the exact
    versions of what it upgraded or replaced (the constraints pin only the torch stack
    and the manager, so a trainer dependency may have moved)."""
    after = venvmod.observe(ctx.paths).dists
    # The package itself goes even when it was there before this try: a run killed
    # between its install and its rollback left it behind.
    added = sorted((set(after) - set(before)) | ({name} & set(after)))
    if added:
        installer.uninstall(added)
    moved = sorted(f"{n}=={v}" for n, v in before.items()
                   if n != name and (n not in after or after[n].version != v))
    if not moved:
        return
    outcome = installer.install(Request(requirements=tuple(moved),
                                        constraints=(ctx.constraints,), no_deps=True))
    if outcome.ok:
        ctx.changes.append(f"restored {', '.join(moved)} after rolling back {name}")
    else:
        ctx.warnings.append(f"rolling back {name} could not restore {', '.join(moved)} "
                            f"({outcome.last_line()}); they stay as {name} left them")


def _run_unavailable(ctx: Context, state: State, step: Step) -> None:
    opt = _optional(ctx, step.target)
    state.optional[opt.name] = {"requirement": opt.requirement, "kind": opt.kind,
                                "status": "unavailable", "detail": opt.reason}


def _run_migrate(ctx: Context, state: State, step: Step) -> None:
    from manager import migrations

    def applied(migration_id: str) -> None:
        state.migrations.append(migration_id)
        save_state(ctx.paths, state)
        ctx.changes.append(f"applied migration {migration_id}")

    def note(text: str) -> None:
        ctx.report(text)
        ctx.warnings.append(text)

    migrations.run_pending(ctx.paths.root, list(state.migrations), applied, report=note)


def _run_tools(ctx: Context, state: State, step: Step) -> None:
    from manager import tools

    outcomes = tools.provision_all(ctx.paths, ctx.log.note)
    state.tools = dict(outcomes) or {"_checked": {"status": "ok", "detail": "none needed"}}
    for name, outcome in outcomes.items():
        status, detail = outcome.get("status"), outcome.get("detail", "")
        if status == "failed":
            ctx.warnings.append(f"tool {name} could not be provisioned: {detail}")
        elif status == "skipped":
            fix = tools.refusal_hint(name)
            ctx.warnings.append(f"{name} not provisioned: {detail}"
                                + (f"; to get it: {fix}, then run `python3 -m manager "
                                   f"tools --provision`" if fix else ""))


_RUNNERS: dict[str, Callable[[Context, State, Step], None]] = {
    "create-venv": _run_create,
    "rebuild-venv": _run_rebuild,
    "install-torch": _run_torch,
    "install-companion": _run_companion,
    "install-requirements": _run_requirements,
    "reinstall-git-pin": _run_git_pin,
    "try-optional": _run_optional,
    "record-unavailable": _run_unavailable,
    "verify": _run_verify,
    "migrate": _run_migrate,
    "tools": _run_tools,
}
