"""Prodigy8bit (`optimizer: prodigy8bit`): prodigyopt's Prodigy with its two moment
estimates stored in 8 bits between steps, as upstream's optimizer of that name does.

Prodigy is Adam whose step size it estimates itself (lr is a multiplier, 1.0 by
default). Its state per weight is the first and second moments (`exp_avg`,
`exp_avg_sq`), the start weights and a running sum: twice the weights' size in moments.
Upstream's Prodigy8bit keeps the moments in 8 bits to halve the optimizer's memory.
Here the algorithm is prodigyopt's, unchanged; between steps each moment is kept as
bitsandbytes' blockwise 8-bit code (the dynamic quantization its 8-bit Adam uses:
signed for the first moment, unsigned for the second), and decoded for the step.

The state dict holds the codes and their per-block scales as plain tensors, so a
checkpoint resumes the quantized moments exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from prodigyopt import Prodigy

from aitk.run.optim import import_bitsandbytes

BLOCK = 256  # values per scale: bitsandbytes' size for optimizer state
MOMENTS = {"exp_avg": True, "exp_avg_sq": False}  # name -> signed code


class Prodigy8bit(Prodigy):
    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._bnb = import_bitsandbytes().functional
        self._codes: dict[bool, torch.Tensor] = {}

    def _code(self, signed: bool, device: torch.device) -> torch.Tensor:
        if signed not in self._codes:
            self._codes[signed] = self._bnb.create_dynamic_map(signed=signed)
        return self._codes[signed].to(device)

    def _decode(self) -> None:
        for state in self.state.values():
            for name, signed in MOMENTS.items():
                if f"{name}_q" in state:
                    # torch's load_state_dict casts every state tensor to the weights'
                    # dtype; the codes (0..255) and the shape survive that exactly.
                    q = state.pop(f"{name}_q").to(torch.uint8)
                    absmax = state.pop(f"{name}_absmax").float()
                    shape = state.pop(f"{name}_shape").long().tolist()
                    out = self._bnb.dequantize_blockwise(
                        q, absmax=absmax, code=self._code(signed, q.device),
                        blocksize=BLOCK)
                    state[name] = out.reshape(shape)

    def _encode(self) -> None:
        for state in self.state.values():
            for name, signed in MOMENTS.items():
                if name in state:
                    value = state.pop(name)
                    q, quant = self._bnb.quantize_blockwise(
                        value.float().contiguous(), code=self._code(signed, value.device),
                        blocksize=BLOCK)
                    state[f"{name}_q"] = q
                    state[f"{name}_absmax"] = quant.absmax
                    state[f"{name}_shape"] = torch.tensor(list(value.shape))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self._decode()
        try:
            return super().step(closure)
        finally:
            self._encode()
