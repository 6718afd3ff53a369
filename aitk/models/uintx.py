"""`uint2` .. `uint8` weights: affine integer codes packed to their bit width.

The scheme is upstream's (torchao 0.10's UIntXWeightOnlyConfig, which upstream's
accuracy recovery adapters were fitted against): per group of 64 weights along the input
axis, asymmetric, zero kept exact, the scale in the weight's dtype and an integer zero
point. torchao's affine primitives (`choose_qparams_affine`, `quantize_affine`,
`dequantize_affine`) do that arithmetic here. What torchao 0.18 no longer has is a
packed layout: its IntxWeightOnlyConfig keeps every code in one byte, so a 3-bit 20B
model would take 20 GB instead of 8. `pack_codes` stores N bit planes of one bit per
code (N/8 bytes per weight for any N), which two shifts and a mask undo; 8-bit codes are
kept as they are.

`UIntXLinear` replaces an nn.Linear (it stays one, so LoRA finds and wraps it) and
holds the packed codes, scales and zero points as buffers. Its forward dequantizes the
weight, and its backward dequantizes it again instead of keeping the float weight for
the whole step (`_FrozenLinear`): autograd would otherwise hold every layer's float
weight until backward, as much memory as the unquantized model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUP = 64


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes (< 2**bits, any shape) -> (bits, ceil(n / 8)) uint8 bit planes."""
    flat = codes.reshape(-1).to(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    eights = flat.view(-1, 8)
    if bits == 8:  # a byte per code already: the planes would only cost time and memory
        return eights.reshape(1, -1).clone()
    place = torch.arange(8, dtype=torch.uint8, device=flat.device)
    planes = torch.empty(bits, eights.shape[0], dtype=torch.uint8, device=flat.device)
    for b in range(bits):
        plane = (eights >> b) & 1
        planes[b] = (plane << place).sum(dim=1, dtype=torch.uint8)
    return planes


def unpack_codes(planes: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    """The inverse of `pack_codes`: a flat uint8 tensor of `numel` codes."""
    if bits == 8:  # stored whole
        return planes.view(-1)[:numel]
    place = torch.arange(8, dtype=torch.uint8, device=planes.device)
    out = torch.zeros(planes.shape[1], 8, dtype=torch.uint8, device=planes.device)
    for b in range(planes.shape[0]):
        out |= ((planes[b].unsqueeze(1) >> place) & 1) << b
    return out.view(-1)[:numel]


def can_quantize(layer: nn.Linear) -> bool:
    """Upstream's rule: the input width must split into groups of 64 (other layers stay
    in float)."""
    return layer.weight.dim() == 2 and layer.in_features % GROUP == 0


class _FrozenLinear(torch.autograd.Function):
    """y = x W^T + b with W rebuilt from its codes in forward and again in backward;
    no gradient for W or b (the base is frozen; LoRA trains beside it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: UIntXLinear) -> torch.Tensor:  # type: ignore[override]
        ctx.layer = layer
        weight = layer.dequantize(x.dtype)
        bias = None if layer.bias is None else layer.bias.to(x.dtype)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        weight = ctx.layer.dequantize(grad.dtype)
        return grad @ weight, None


class UIntXLinear(nn.Linear):
    """An nn.Linear whose weight is stored as packed `bits`-bit codes."""

    def __init__(self, layer: nn.Linear, bits: int) -> None:
        from torchao.quantization.quant_primitives import (
            MappingType,
            choose_qparams_affine,
            quantize_affine,
        )

        nn.Module.__init__(self)  # not nn.Linear's: no float weight is allocated
        self.in_features, self.out_features, self.bits = layer.in_features, \
            layer.out_features, bits
        weight = layer.weight.detach()
        self.weight_dtype = weight.dtype
        qmax = (1 << bits) - 1
        block = (1, GROUP)
        # In the weight's own dtype, as upstream's torchao 0.10 did (so its adapters fit).
        scale, zero = choose_qparams_affine(
            weight, MappingType.ASYMMETRIC, block, torch.uint8, 0, qmax,
            eps=torch.finfo(torch.float32).eps, scale_dtype=weight.dtype,
            zero_point_dtype=torch.int32)
        codes = quantize_affine(weight, block, scale, zero, torch.uint8, 0, qmax)
        self.register_buffer("codes", pack_codes(codes, bits), persistent=False)
        self.register_buffer("scale", scale.reshape(self.out_features, -1).contiguous(),
                             persistent=False)
        self.register_buffer("zero_point", zero.reshape(self.out_features, -1).to(
            torch.uint8), persistent=False)
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach(),
                                                                 requires_grad=False)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The float weight (out, in) the codes stand for, in `dtype` (the scale's)."""
        from torchao.quantization.quant_primitives import dequantize_affine

        codes = unpack_codes(self.codes, self.out_features * self.in_features, self.bits)
        codes = codes.view(self.out_features, self.in_features)
        w = dequantize_affine(codes, (1, GROUP), self.scale, self.zero_point.to(torch.int32),
                              torch.uint8, 0, (1 << self.bits) - 1,
                              output_dtype=self.scale.dtype)
        return w if dtype is None else w.to(dtype)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The dequantized weight (peft reads its device and dtype; a merge its values)."""
        return self.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FrozenLinear.apply(x, self)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}, bias={self.bias is not None}")
