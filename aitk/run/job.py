"""run_job: one job config, from loaded to its exit code (it never raises).

It installs the stop signals (aitk.run.signals), registers the running job in the
checkout (`.aitk-run/<pid>.json`, which the manager's `update` checks), publishes the
status file (aitk.run.status), runs each process of the config in turn
(aitk.run.process) and is the job's error boundary: a known error is one line and its
exit code, anything else a traceback and exit 1.

Exit codes: 0 finished; 1 training failed (e.g. a non-finite loss, a full disk); 2 the
config or its inputs are unusable (bad key, missing dataset, unknown arch, the output
folder in use by another trainer, checkpoints that exist but none validates); 130
stopped by Ctrl+C, SIGTERM or SIGHUP (SIGBREAK on Windows) after saving a checkpoint at
a step boundary. What a run writes is listed in aitk.run.output.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from aitk.config.loading import REPO_ROOT, LoadedConfig
from aitk.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ConfigError,
    Interrupted,
    TrainerError,
)
from aitk.run import distributed
from aitk.run.signals import LenientStream, StopFlag
from aitk.run.status import StatusFile
from aitk.run.train import Outcome
from aitk_common import records
from aitk_common.files import DiskFull, is_disk_full
from aitk_common.status import status_path


@contextmanager
def registered(name: str, config: Path) -> Iterator[None]:
    """The run record `.aitk-run/<pid>.json` while the job runs (aitk_common.records);
    the manager's `update` and `sync` check it."""
    try:
        records.write_run_record(REPO_ROOT, records.RunRecord(
            os.getpid(), name, str(config), records.utc_now()))
    except OSError as exc:  # a read-only checkout must not stop training
        print(f"warning: cannot register the running job in {REPO_ROOT / records.RUN_DIR}: "
              f"{exc.strerror or exc}", file=sys.stderr)
    try:
        yield
    finally:
        records.remove_run_record(REPO_ROOT, os.getpid())


def run_job(loaded: LoadedConfig, stream: TextIO | None = None) -> int:
    """Run every process of one config, of any job kind; returns the exit code (never
    raises)."""
    stream = LenientStream(stream or sys.stderr)  # type: ignore[assignment]
    # Under torchrun rank 0 alone writes the status file (aitk.run.distributed).
    writes = os.environ.get("RANK", "0") == "0"
    status = StatusFile(status_path(loaded.job.status_dir()) if writes else None,
                        loaded.name)
    status.phase("loading")
    code = _run_job(loaded, stream, status)
    status.finish(code)
    return code


def _run_job(loaded: LoadedConfig, stream: TextIO, status: StatusFile) -> int:
    from aitk.jobs import runner_for

    for warning in loaded.warnings:
        print(f"warning: {warning}", file=stream)
    stop = StopFlag(say=lambda m: print(m, file=stream, flush=True))
    world = distributed.SINGLE
    try:
        world = distributed.World.from_env()
        run_process = runner_for(loaded.kind)
        with stop.installed(), registered(loaded.name, loaded.source):
            for proc in loaded.job.processes:
                if run_process(loaded, proc, stop, stream, world, status) is Outcome.STOPPED:
                    if world.is_main:
                        print(f"stopped; run the same config again to resume "
                              f"{loaded.name}", file=stream)
                    return EXIT_INTERRUPTED
        return EXIT_OK
    except (Interrupted, KeyboardInterrupt):
        if loaded.kind in ("extension", "train"):
            print(f"stopped; run the same config again to resume {loaded.name}",
                  file=stream)
        else:  # extract, mod, merge, generate: every output is written whole or not at all
            print(f"stopped; the files {loaded.name} finished are written, the one it was "
                  "on is not", file=stream)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the job's error boundary
        return failed(exc, loaded.name, stream, status)
    finally:
        distributed.shutdown(world)


def failed(exc: Exception, name: str, stream: TextIO, status: StatusFile) -> int:
    """Say why job `name` failed, record it in the status file, return the exit code.
    A TrainerError is its one line (aitk.errors); a full disk says what is full and
    that the last checkpoint is kept; anything else is a bug: its traceback, exit 1."""
    if is_disk_full(exc):  # one line: what is full, how much, what to do
        where = exc if isinstance(exc, DiskFull) else \
            f"not enough disk space ({exc.strerror}: {exc.filename})"  # type: ignore[attr-defined]
        print(f"error: {where}; the last saved checkpoint is kept: free some space, "
              f"then run the same config again to resume {name}", file=stream)
        return EXIT_FAILED
    if not isinstance(exc, TrainerError) or exc.show_traceback:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
        print(f"error: {name} failed: {exc.__class__.__name__}: {exc}", file=stream)
        status.failed(f"{exc.__class__.__name__}: {exc}")
        return exc.exit_code if isinstance(exc, TrainerError) else EXIT_FAILED
    print(f"error: {exc}", file=stream)
    status.failed(str(exc), exc.problems if isinstance(exc, ConfigError) else None)
    return exc.exit_code
