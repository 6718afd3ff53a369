"""`model.layer_offloading`: a share of a part's repeated blocks lives in CPU memory
(pinned where CUDA) and visits the compute device only while it runs, forward and
backward; on CUDA the next offloaded block is copied on a side stream while the current
one computes.

Which blocks repeat is the model's answer (`BaseModel.offload_blocks`), never an arch
name here. The share is spread evenly over the blocks (`offloaded_indices`), so a resident
block computes while the next offloaded one is copied.

Why not diffusers' group offloading (`diffusers.hooks.apply_group_offloading`, 0.42),
which does the same for inference:
- it offloads every block of a module and the module's own leftovers, never a share;
- it moves every tensor of a group, the trainable adapter's too: with a stream it puts
  back the pinned copy it took when the hook was installed (the optimizer's updates are
  lost), without one it moves the adapter and its gradients under the optimizer;
- it swaps `param.data` back to the CPU at the end of forward, while autograd still holds
  some of those parameters for backward (a norm's weight, an elementwise scale): backward
  then meets a CPU weight in a CUDA graph.
Here only frozen tensors move, and each visit puts fresh device copies into the block's
parameter slots for the length of its forward: autograd owns what it saved of them, so
what backward needs lives exactly until backward has used it (with gradient
checkpointing the recompute visits again, and only one block's weights are on the device
at a time); between visits the slots hold the CPU copies.

`model.low_vram` is another mechanism (aitk.models.offload: a whole idle part visits).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


def offloaded_indices(count: int, share: float) -> list[int]:
    """Which of `count` blocks are offloaded for `share` (0..1): round(share * count) of
    them, spread evenly (block i when floor((i + 1) * share) passes an integer)."""
    share = min(max(float(share), 0.0), 1.0)
    wanted = round(share * count)
    if wanted == 0:
        return []
    step = wanted / count
    return [i for i in range(count) if math.floor((i + 1) * step + 1e-9)
            > math.floor(i * step + 1e-9)]


def repeated_blocks(module: nn.Module, top_level: bool = True) -> list[nn.Module]:
    """The repeated blocks of `module`, in order. A denoiser (`top_level`): the items of
    its top-level ModuleLists (Flux's double then single blocks), looked for one level
    down when it has none (a wrapper of two experts). A text encoder
    (`top_level=False`): the items of its largest ModuleList anywhere (its layers)."""
    if top_level:
        found = [b for child in module.children() if isinstance(child, nn.ModuleList)
                 for b in child]
        if found:
            return found
        return [b for child in module.children() if not isinstance(child, nn.ModuleList)
                for child_list in child.children() if isinstance(child_list, nn.ModuleList)
                for b in child_list]
    lists = [m for m in module.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return []
    biggest = max(lists, key=lambda ml: sum(p.numel() for p in ml.parameters()))
    return list(biggest)


@dataclass
class _Slot:
    """One frozen tensor of a block: where it sits and its CPU home."""

    owner: nn.Module
    table: str  # "_parameters" or "_buffers"
    name: str
    home: torch.Tensor  # the CPU copy (pinned where CUDA)
    rest: torch.Tensor  # what the slot holds between visits: `home` (as a Parameter)

    def fill(self, tensor: torch.Tensor) -> None:
        getattr(self.owner, self.table)[self.name] = tensor

    def wrap(self, tensor: torch.Tensor) -> torch.Tensor:
        """A device copy as the slot's kind: a frozen Parameter or a plain buffer."""
        return nn.Parameter(tensor, requires_grad=False) if self.table == "_parameters" \
            else tensor

    def holds(self) -> torch.Tensor:
        return getattr(self.owner, self.table)[self.name]


@dataclass
class _Block:
    index: int
    module: nn.Module
    slots: list[_Slot]
    copies: list[torch.Tensor] | None = None  # on the device while visiting
    ready: Any = None  # CUDA event: the prefetch copy is done
    handles: list[Any] = field(default_factory=list)

    @property
    def plain(self) -> bool:
        """Only plain tensors: a side-stream copy can be handed to the compute stream
        (`record_stream`); a tensor subclass (a quantized weight) is copied on the
        compute stream when its block runs instead."""
        return all(type(s.home) is torch.Tensor for s in self.slots)


class BlockOffloader:
    """Offloads `blocks` (the chosen share of a part's repeated blocks) to the CPU and
    brings each to `device` for its forward (and its recompute under checkpointing).

    `moves` counts visits (a test's evidence that blocks travel); `resident()` the
    offloaded blocks holding device copies right now.
    """

    def __init__(self, blocks: Sequence[nn.Module], device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.moves = 0
        self.blocks: list[_Block] = []
        self._last = -1
        self._pending: _Block | None = None  # prefetched, not yet entered
        homes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shared: moved once
        for i, module in enumerate(blocks):
            block = _Block(i, module, list(self._slots(module, homes)))
            for slot in block.slots:
                slot.fill(slot.rest)  # the device copy loaded before is freed here
            block.handles = [
                module.register_forward_pre_hook(lambda m, a, b=block: self._enter(b)),
                module.register_forward_hook(lambda m, a, o, b=block: self._leave(b),
                                             always_call=True)]
            self.blocks.append(block)

    def _slots(self, module: nn.Module, homes: dict[int, tuple[torch.Tensor, torch.Tensor]]
               ) -> Iterator[_Slot]:
        for owner in module.modules():
            for table in ("_parameters", "_buffers"):
                for name, tensor in getattr(owner, table).items():
                    # The adapter trains on the device: only frozen tensors travel.
                    if tensor is None or tensor.requires_grad:
                        continue
                    if id(tensor) not in homes:
                        home = self._home(tensor)
                        rest = nn.Parameter(home, requires_grad=False) \
                            if table == "_parameters" else home
                        homes[id(tensor)] = (home, rest)
                    yield _Slot(owner, table, name, *homes[id(tensor)])

    def _home(self, tensor: torch.Tensor) -> torch.Tensor:
        home = tensor.detach().to("cpu")
        # Pinned pages make the host-to-device copy asynchronous; a tensor subclass
        # (a quantized weight) may not pin, and then copies synchronously.
        if self.cuda and type(home) is torch.Tensor:
            home = home.pin_memory()
        return home

    # ---- visits ------------------------------------------------------------------------
    def _copy(self, block: _Block) -> list[torch.Tensor]:
        # copy=True: a CPU compute device still gets its own copies, so a visit is a
        # visit on every device (what the CPU tests count).
        return [s.home.to(self.device, non_blocking=self.cuda, copy=True)
                for s in block.slots]

    def _prefetch(self, block: _Block) -> None:
        assert self.stream is not None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            block.copies = self._copy(block)
            block.ready = torch.cuda.Event()
            block.ready.record(self.stream)
        self._pending = block

    def _enter(self, block: _Block) -> None:
        if self._pending is not None and self._pending is not block:
            self._pending.copies, self._pending.ready = None, None  # guessed wrong
        self._pending = None
        if block.copies is None:
            block.copies = self._copy(block)
        elif block.ready is not None:  # prefetched on the side stream
            current = torch.cuda.current_stream(self.device)
            current.wait_event(block.ready)
            for t in block.copies:  # allocated on the side stream, used on this one
                if type(t) is torch.Tensor:
                    t.record_stream(current)
            block.ready = None
        for slot, copy in zip(block.slots, block.copies, strict=True):
            slot.fill(slot.wrap(copy))
        self.moves += 1
        # Forward walks the blocks up, a checkpointed backward's recompute down.
        direction = -1 if block.index < self._last else 1
        self._last = block.index
        following = block.index + direction
        if self.stream is not None and 0 <= following < len(self.blocks) and \
                self.blocks[following].plain:
            self._prefetch(self.blocks[following])

    def _leave(self, block: _Block) -> None:
        for slot in block.slots:
            slot.fill(slot.rest)
        block.copies = None  # autograd keeps what backward needs, nothing else stays

    # ---- queries -----------------------------------------------------------------------
    def resident(self) -> int:
        """Offloaded blocks whose slots hold device copies now."""
        return sum(1 for b in self.blocks
                   if any(s.holds() is not s.rest for s in b.slots))

    def remove(self) -> None:
        """Take the hooks off; the blocks stay in CPU memory."""
        for block in self.blocks:
            for handle in block.handles:
                handle.remove()
            block.handles = []


def offload_share(blocks: Sequence[nn.Module], share: float,
                  device: torch.device | str) -> BlockOffloader | None:
    """Offload `share` of `blocks` (evenly spread); None when the share is no block."""
    chosen = [blocks[i] for i in offloaded_indices(len(blocks), share)]
    return BlockOffloader(chosen, device) if chosen else None


def offload_part(model: Any, role: Any, share: float) -> BlockOffloader | None:
    """`layer_offloading` for one part of a loaded model (a BaseModel): `share` of the
    blocks `model.offload_blocks(role)` names, onto `model.device`. The denoiser's must
    come after the adapter is attached (the adapter's layers are made on the device
    of the weights they wrap, and they train there)."""
    return offload_share(model.offload_blocks(role), share, model.device)
