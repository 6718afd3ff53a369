"""`model.block_compile` (and upstream's `model.compile`): torch.compile on each of the
denoiser's repeated blocks (`BaseModel.offload_blocks`), off by default as upstream.

Each block's `forward` is compiled, not the module call: the module's hooks (layer
offloading's visits, the LoRA dropout switch) stay outside the compiled graph, and the
blocks share one code object, so after the first block the others reuse its graph
(dynamo guards on the tensors' shapes and dtypes, not on which block they belong to).
A whole-model compile would break its graph at every hook and every Python-side branch
of the diffusers forward, so `compile` compiles per block too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class CompileSettings:
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = True
    cache_size_limit: int | None = None
    backend: str = "inductor"  # the tests use "eager" (no C compiler needed)


def compile_blocks(blocks: Sequence[nn.Module], settings: CompileSettings) -> int:
    """Compile each block's forward in place; the number compiled."""
    import torch

    if settings.cache_size_limit is not None:
        torch._dynamo.config.cache_size_limit = settings.cache_size_limit
    for block in blocks:
        # mode is an inductor option: other backends refuse it
        mode = settings.mode if settings.backend == "inductor" else None
        block.forward = torch.compile(block.forward, mode=mode, backend=settings.backend,
                                      fullgraph=settings.fullgraph,
                                      dynamic=settings.dynamic)
    return len(blocks)
