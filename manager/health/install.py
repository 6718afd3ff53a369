"""What the manager recorded about the install: sync status, state file, migrations and
the outcome of each optional accelerator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from manager.envstatus import NOT_INSTALLED
from manager.errors import StateError
from manager.health.check import FIX_INSTALL, FIX_REPAIR, FIX_SYNC, Check, Probe, fail, ok, warn
from manager.paths import Paths

GOOD_OUTCOMES = ("ok", "installed", "system")
NEUTRAL_OUTCOMES = ("skipped", "unavailable")
# What doing without each optional package means, for the fix line.
WITHOUT = {
    "flash-attn": "attention falls back to PyTorch SDPA",
    "xformers": "attention falls back to PyTorch SDPA",
    "natten": "neighbourhood attention falls back to PyTorch",
    "triton": "torch.compile and Triton kernels are unavailable",
    "triton-windows": "torch.compile and Triton kernels are unavailable",
    "torchcodec": "extensions cannot decode audio or video with it; it loads FFmpeg's "
                  "shared libraries, so provide FFmpeg first (see tool.ffmpeg)",
}


def judge_sync(in_sync: bool, reasons: Sequence[str]) -> Check:
    if in_sync:
        return ok("requirements", "the venv matches the spec and requirements")
    # With nothing installed a sync may not even know the --cpu choice; install asks.
    fix = FIX_INSTALL if NOT_INSTALLED in reasons else FIX_SYNC
    return warn("requirements", "out of sync: " + "; ".join(reasons or ["no reason given"]),
                fix)


def judge_state(exists: bool, venv_exists: bool, state: Any | None,
                error: StateError | None) -> Check:
    if error is not None:
        return fail("state", error.message, error.hint or FIX_REPAIR)
    if not exists:
        what = "this venv was not set up by an install" if venv_exists else "nothing installed"
        return warn("state", f"no state file ({what})", FIX_INSTALL)
    backend = getattr(state, "backend", None) or "unknown"
    cpu = ", --cpu" if getattr(state, "cpu_requested", False) else ""
    return ok("state", f"format v{state.version}, backend {backend}{cpu}")


def judge_migrations(pending: Sequence[str] | None) -> Check:
    if pending is None:
        return warn("migrations", "skipped: the state file is unreadable", FIX_REPAIR)
    if pending:
        return warn("migrations", f"{len(pending)} pending: {', '.join(pending)}", FIX_SYNC)
    return ok("migrations", "none pending")


def judge_accelerators(optional: Mapping[str, Mapping[str, Any]] | None) -> Check:
    if optional is None:
        return warn("accelerators", "skipped: the state file is unreadable", FIX_REPAIR)
    if not optional:
        return ok("accelerators", "none recorded")
    parts, failed = [], []
    for name, outcome in sorted(optional.items()):
        status = str(outcome.get("status", "unknown"))
        why = outcome.get("detail") or outcome.get("reason")
        # Each outcome gets its reason's first line; the whole check stays one line.
        why = str(why).strip().splitlines()[0] if why else None
        parts.append(f"{name} {status}" + (f" ({why})" if why and status != "ok" else ""))
        if status not in GOOD_OUTCOMES + NEUTRAL_OUTCOMES:
            failed.append(name)
    if failed:
        # A plain sync keeps a recorded failure (it would fail the same way); --force
        # is what tries again, once the cause (e.g. FFmpeg for torchcodec) is fixed.
        without = "; ".join(f"{name}: {WITHOUT.get(name, 'not used')}" for name in failed)
        return warn("accelerators", "; ".join(parts),
                    f"optional, the trainer runs without them ({without}); to retry once "
                    f"the cause is fixed: {FIX_SYNC} --force")
    return ok("accelerators", "; ".join(parts))


def _load(paths: Paths) -> tuple[Any | None, StateError | None]:
    from manager.state import load_state

    try:
        return load_state(paths), None
    except StateError as exc:
        return None, exc


def probe_sync(paths: Paths) -> list[Check]:
    from manager.envstatus import quick_status

    if _load(paths)[1] is not None:  # without the recorded --cpu the answer is a guess
        return [warn("requirements", "skipped: the state file is unreadable", FIX_REPAIR)]
    status = quick_status(paths)
    return [judge_sync(status.in_sync, status.reasons)]


def probe_state(paths: Paths) -> list[Check]:
    from manager import migrations

    state, error = _load(paths)
    pending = None if state is None else migrations.pending(state.migrations)
    return [judge_state(paths.state_file.exists(), paths.venv.is_dir(), state, error),
            judge_migrations(pending)]


def probe_accelerators(paths: Paths) -> list[Check]:
    state, _ = _load(paths)
    return [judge_accelerators(None if state is None else state.optional)]


def probes(paths: Paths) -> list[Probe]:
    return [
        Probe(("requirements",), lambda: probe_sync(paths), 30.0),
        Probe(("accelerators",), lambda: probe_accelerators(paths), 10.0),
        Probe(("state", "migrations"), lambda: probe_state(paths), 10.0),
    ]
