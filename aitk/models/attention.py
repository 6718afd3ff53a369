"""Attention kernels, selected at runtime.

SDPA (`torch.nn.functional.scaled_dot_product_attention`, the "native" backend) is the
default: it needs nothing extra, runs on CPU and GPU and already dispatches to fused
kernels where the hardware has them. flash-attn is optional: it is imported here under a
guard, never at a model module's top level, so machines without it still import and load
every model. Attention modules keep an `attention_backend` attribute and branch on it in
`forward` (see `attention`); a model's `set_attention_backend(name)` validates the name
with `check_backend` and sets the flag on every module, so no module instance holding
trained weights is ever swapped out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aitk.errors import AttentionBackendError

try:  # optional accelerator kernel; a missing package is a flag, not an ImportError
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]

    FLASH_ATTN_AVAILABLE = True
except ImportError:
    flash_attn_varlen_func = None
    FLASH_ATTN_AVAILABLE = False

BACKENDS = ("native", "flash")


def check_backend(name: str) -> str:
    """Validate a backend name before any module flag is changed."""
    if name not in BACKENDS:
        raise AttentionBackendError(
            f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "flash" and not FLASH_ATTN_AVAILABLE:
        raise AttentionBackendError(
            "attention backend 'flash' needs the flash-attn package, which is not "
            "installed here; use 'native' (SDPA) or install flash-attn for this GPU")
    return name


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              key_mask: torch.Tensor | None = None, backend: str = "native") -> torch.Tensor:
    """Multi-head attention over (B, H, L, Dh) tensors.

    key_mask: optional (B, Lk) bool, True on keys that may be attended (text padding).
    Returns (B, H, Lq, Dh).
    """
    if backend == "flash":
        return _flash(q, k, v, key_mask)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           key_mask: torch.Tensor | None) -> torch.Tensor:
    if flash_attn_varlen_func is None:
        check_backend("flash")  # raises the clear error
    b, h, lq, dh = q.shape
    lk = k.shape[2]
    if key_mask is None:
        key_mask = torch.ones(b, lk, dtype=torch.bool, device=k.device)
    # varlen layout: (total_tokens, H, Dh) with cumulative sequence offsets.
    q_flat = q.transpose(1, 2).reshape(b * lq, h, dh)
    k_tok = k.transpose(1, 2)[key_mask]
    v_tok = v.transpose(1, 2)[key_mask]
    k_lens = key_mask.sum(dim=1, dtype=torch.int32)
    cu_k = F.pad(torch.cumsum(k_lens, 0, dtype=torch.int32), (1, 0))
    cu_q = torch.arange(0, (b + 1) * lq, lq, dtype=torch.int32, device=q.device)
    dtype = q.dtype
    if dtype not in (torch.float16, torch.bfloat16):  # flash kernels are half-precision
        q_flat, k_tok, v_tok = (t.to(torch.bfloat16) for t in (q_flat, k_tok, v_tok))
    out = flash_attn_varlen_func(q_flat, k_tok, v_tok, cu_q, cu_k, lq, int(k_lens.max()))
    return out.to(dtype).reshape(b, lq, h, dh).transpose(1, 2)
