"""Low-rank factors of a weight difference, by SVD: what extraction and a rank-limited
merge write as LoRA (down, up) pairs.

A difference D (out, in) or a conv's (out, in, k, k), read as (out, in*k*k), is
U S Vh; keeping r singular values gives down = Vh[:r] (r, in[, k, k]) and up = U[:, :r]
S[:r] (out, r[, 1, 1]), with alpha = r, so up @ down is the best rank-r approximation
(Eckart-Young). How many to keep, upstream's modes (LyCORIS's extract_diff):

    fixed       `param` singular values (the rank)
    threshold   those above `param`
    ratio       those above `param` x the largest
    quantile    the fewest whose sum reaches `param` x the sum of all (a fixed share)

Every mode keeps at least 1 and at most min(out, in*k*k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Factors:
    down: torch.Tensor  # (r, in) or (r, in, k, k)
    up: torch.Tensor  # (out, r) or (out, r, 1, 1)
    error: float  # ||D - up @ down|| / ||D|| (Frobenius; 0 for D = 0)

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])


def kept_rank(s: torch.Tensor, mode: str, param: float) -> int:
    """How many of the singular values `s` (descending) a mode keeps."""
    if mode == "fixed":
        rank = int(param)
    elif mode == "threshold":
        rank = int((s > param).sum())
    elif mode == "ratio":
        rank = int((s > s.max() * param).sum()) if s.numel() else 0
    elif mode == "quantile":
        # The fewest leading values whose running sum reaches `param` of the total.
        running = torch.cumsum(s, 0)
        rank = int((running < param * s.sum()).sum()) + 1
    else:
        raise ValueError(f"unknown extraction mode {mode!r}")
    return max(1, min(rank, s.numel()))


def _split(u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor, rank: int,
           shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    down = vh[:rank]
    up = u[:, :rank] * s[:rank]
    if len(shape) == 4:  # a conv: down keeps the kernel, up is 1x1
        down = down.reshape(rank, *shape[1:])
        up = up.reshape(shape[0], rank, 1, 1)
    return down.contiguous(), up.contiguous()


def _error(s: torch.Tensor, rank: int) -> float:
    total = float(s.pow(2).sum())
    return (float(s[rank:].pow(2).sum()) / total) ** 0.5 if total > 0 else 0.0


def factorize(delta: torch.Tensor, mode: str, param: float) -> Factors:
    """The LoRA factors of one layer's difference (float32 math)."""
    shape = delta.shape
    matrix = delta.float().reshape(shape[0], -1)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    rank = kept_rank(s, mode, param)
    down, up = _split(u, s, vh, rank, shape)
    return Factors(down, up, _error(s, rank))


def truncate(down: torch.Tensor, up: torch.Tensor, rank: int) -> Factors:
    """The best rank-`rank` factors of up @ down, from the factors alone: QR of each side,
    then the SVD of the small (r, r) core, so no (out, in) product is ever formed."""
    shape = torch.Size((up.shape[0], *down.shape[1:]))
    a = down.float().reshape(down.shape[0], -1)  # (r, in')
    b = up.float().reshape(up.shape[0], -1)  # (out, r)
    qb, rb = torch.linalg.qr(b)  # (out, r), (r, r)
    qa, ra = torch.linalg.qr(a.T)  # (in', r), (r, r)
    u, s, vh = torch.linalg.svd(rb @ ra.T)
    keep = max(1, min(rank, s.numel()))
    return Factors(*_split(qb @ u, s, vh @ qa.T, keep, shape), _error(s, keep))
