"""Data-parallel training under torchrun: which rank this is, and the few collectives the
loop needs.

`torchrun --nproc-per-node N run.py CONFIG` starts N copies of the trainer with RANK,
WORLD_SIZE, LOCAL_RANK and the rendezvous address in their environment (several
machines: the same command on each, with `--nnodes`, `--node-rank` and `--rdzv-endpoint`
or `--master-addr`). Without those variables this is a world of one and every helper is
a no-op, so a plain `python run.py` never touches torch.distributed.

How the work is split, and why:
- Every rank loads the model and attaches the same adapter (same seed), and draws the
  same stream of batches; rank r of W trains on batch number `k * W + r` of that
  stream and on noise micro-step `micro * W + r`. A step on W ranks with accumulation A
  is then exactly a single-process step with accumulation A * W (the same batches, the
  same noise, the mean of the same gradients), so `batch_size` stays per GPU and the
  effective batch is batch_size * gradient_accumulation * W. Resuming with another W
  continues the same stream from the same global step.
- Adapter gradients are averaged with one all-reduce over a flat buffer after the
  backward passes, instead of wrapping the network in DistributedDataParallel: each
  arch calls its own transformer inside `get_noise_prediction`, so a DDP wrapper would
  have to be threaded through every arch; adapters are a few MB, so the one collective
  per step costs little. Frozen (and quantized) base weights are never communicated.
- The stop flag (Ctrl+C, SIGTERM, SIGHUP on any rank) is agreed with a MAX all-reduce at
  every step boundary, so all ranks stop at the same step; rank 0 alone writes
  checkpoints, LoRA files, samples, the loss log and the status file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import torch

from aitk.errors import DistributedError, PeerLost


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> World:
        env = dict(os.environ if env is None else env)
        try:
            size = int(env.get("WORLD_SIZE", "1"))
            rank = int(env.get("RANK", "0"))
            local = int(env.get("LOCAL_RANK", str(rank)))
        except ValueError as exc:
            raise DistributedError(f"bad torchrun environment: {exc}") from None
        if size < 1 or not 0 <= rank < size:
            raise DistributedError(f"bad torchrun environment: RANK={rank}, "
                                   f"WORLD_SIZE={size}")
        return cls(rank=rank, size=size, local_rank=local)


SINGLE = World()  # a plain `python run.py`


def device_for(world: World, requested: torch.device) -> torch.device:
    """Each rank's device: cuda:LOCAL_RANK when training on CUDA."""
    if not world.distributed or requested.type != "cuda":
        return requested
    count = torch.cuda.device_count()
    if world.local_rank >= count:
        raise DistributedError(
            f"rank {world.rank} wants GPU {world.local_rank} but this machine has {count}; "
            f"start at most {count} processes per node (--nproc-per-node / --gpus)")
    return torch.device("cuda", world.local_rank)


def init(world: World, device: torch.device) -> None:
    """Join the process group (NCCL on CUDA, gloo otherwise); a no-op for one rank."""
    if not world.distributed or torch.distributed.is_initialized():
        return
    if device.type == "cuda":
        if not torch.distributed.is_nccl_available():
            raise DistributedError("multi-GPU training on CUDA needs NCCL, which this torch "
                                   "build lacks; install the CUDA build of torch "
                                   "(python3 -m manager sync)")
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    torch.distributed.init_process_group(backend=backend, rank=world.rank,
                                         world_size=world.size)


def shutdown(world: World) -> None:
    if world.distributed and torch.distributed.is_initialized():
        # A group whose peer died cannot be torn down cleanly; the process ends anyway.
        with suppress(RuntimeError):
            torch.distributed.destroy_process_group()


@contextmanager
def collective(world: World) -> Iterator[None]:
    """Around a collective: when a peer rank is gone (killed, crashed), gloo and NCCL
    raise a RuntimeError with their own page of detail; the user gets PeerLost, one
    line (the agent then stops this rank too and reports the first failure)."""
    try:
        yield
    except RuntimeError as exc:
        raise PeerLost(f"another training process of this run ended unexpectedly, so "
                       f"rank {world.rank} of {world.size} stopped too; the last saved "
                       "checkpoint is kept") from exc


def barrier(world: World) -> None:
    if world.distributed:
        with collective(world):
            torch.distributed.barrier()


def agree(world: World, flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on any (the stop flag)."""
    if not world.distributed:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    with collective(world):
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


def mean(world: World, value: torch.Tensor) -> torch.Tensor:
    """The mean of a tensor over ranks (the logged loss)."""
    if not world.distributed:
        return value
    out = value.detach().clone()
    with collective(world):
        torch.distributed.all_reduce(out)
    return out / world.size


def average_gradients(world: World, params: Sequence[torch.nn.Parameter]) -> None:
    """Replace each gradient by its mean over ranks, in one all-reduce. A parameter that
    got no gradient on a rank counts as zero there, as it would in one process."""
    if not world.distributed or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with collective(world):
        torch.distributed.all_reduce(flat)
    flat /= world.size
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
        offset += n


def micro_index(world: World, micro: int) -> int:
    """The noise micro-step this rank draws: as if one process ran them all."""
    return micro * world.size + world.rank
