"""`low_vram`'s one mechanism: an idle part waits on the CPU and visits the device only
while it works (text encoders while embedding, a VAE while encoding or decoding, the idle
Wan 2.2 expert)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def visiting(module: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """`module` on `device` inside the block, back on the CPU after it (even on error)."""
    module.to(device)
    try:
        yield
    finally:
        module.to("cpu")
