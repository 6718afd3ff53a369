"""`run.py --gpus N [--nnodes K --node-rank R --master-addr HOST --master-port P]`:
re-run the same command under torchrun, from the same Python (so inside the managed
environment), one trainer process per GPU.

A config may ask for it too (`gpus: N` in a process). Already under torchrun (WORLD_SIZE
set), nothing happens. With no CUDA GPU at all, N processes train on the CPU over gloo
(useful to try a setup, and what the tests do); more GPUs than the machine has is an
error. Several machines meet through torchrun's c10d rendezvous at MASTER_ADDR:PORT.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aitk.errors import LaunchError

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class RankRequest:
    gpus: int = 1
    nnodes: int = 1
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int = DEFAULT_PORT
    rdzv_id: str = "aitk"

    @property
    def wanted(self) -> bool:
        return self.gpus > 1 or self.nnodes > 1


# Workers get this long to finish their step and save after a stop signal before the
# agent kills them (torchrun's default, 30 s, is shorter than one save of a big model).
SHUTDOWN_TIMEOUT_S = 600


def torchrun_args(req: RankRequest, script: Path, script_args: Sequence[str],
                  cuda_gpus: int) -> list[str]:
    """torchrun's command line for `req`; pure, so tests check every decision."""
    if req.gpus < 1 or req.nnodes < 1:
        raise LaunchError("--gpus and --nnodes must be at least 1")
    if cuda_gpus and req.gpus > cuda_gpus:
        raise LaunchError(f"{req.gpus} GPUs asked for, but this machine has {cuda_gpus}; "
                          f"use --gpus {cuda_gpus} or fewer")
    argv = ["--nproc-per-node", str(req.gpus), "--shutdown-timeout",
            str(SHUTDOWN_TIMEOUT_S)]
    if req.nnodes == 1:
        argv.append("--standalone")  # a free local rendezvous port, nothing to configure
    else:
        if not req.master_addr:
            raise LaunchError("--nnodes > 1 needs --master-addr (the host every machine "
                              "can reach; run the same command on each machine)")
        argv += ["--nnodes", str(req.nnodes), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"{req.master_addr}:{req.master_port}",
                 "--rdzv-id", req.rdzv_id]
        if req.node_rank is not None:
            argv += ["--node-rank", str(req.node_rank)]
    return [*argv, str(script), *script_args]


def cuda_gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def config_gpus(names: Sequence[str]) -> int:
    """The largest `gpus:` any of the configs asks for (unreadable ones count as 1: the
    run reports them properly)."""
    from aitk.config.loading import read_config_file, resolve_config_path
    from aitk.errors import ConfigError

    most = 1
    for name in names:
        try:
            raw = read_config_file(resolve_config_path(name))
            procs = raw["config"]["process"]
            most = max([most, *(int(p.get("gpus", 1)) for p in procs)])
        except (ConfigError, KeyError, TypeError, ValueError, AttributeError):
            continue
    return most


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ


# After the first rank exits, torchrun's agent ends the others with SIGTERM (143), then
# SIGKILL (137): codes that follow a failure rather than cause one.
AGENT_KILLS = (143, 137)


def failure_code(exitcodes: Sequence[int]) -> int:
    """One exit code for the failed ranks (a rank killed by signal N counts 128 + N): a
    real failure's code when there is one; else 130 when a rank stopped after saving
    (the agent then ended the others); else the signal that ended them."""
    codes = [128 - c if c < 0 else c for c in exitcodes] or [1]
    real = [c for c in codes if c not in (130, *AGENT_KILLS)]
    if real:
        return real[0]
    return 130 if 130 in codes else codes[0]


def launch(args: list[str], gpus: int, cuda_gpus: int) -> int:
    """Run torchrun's agent in this process (it starts and watches the ranks) and turn
    its outcome into the trainer's exit code, without its multi-page error report."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    where = f"{gpus} GPUs" if cuda_gpus else f"{gpus} CPU processes (no CUDA GPU; gloo)"
    print(f"starting torchrun with {where} per node", file=sys.stderr, flush=True)
    try:
        run(get_args_parser().parse_args(args))
    except ChildFailedError as exc:
        code = failure_code([f.exitcode for f in exc.failures.values()])
        if code != 130:
            print(f"error: a training process failed (exit {code}); the others were "
                  "stopped; the last checkpoint is kept", file=sys.stderr)
        return code
    except SignalException:  # Ctrl+C/SIGTERM/SIGHUP here: the ranks saved and stopped
        return 130
    return 0
