"""A minimal DiT for the `example` arch, written for this repo.

Patchify -> tokens with 2-D sin-cos positions; timestep embedding on the 0..1000 scale
(1000 = pure noise, the same scale as the BaseModel API) plus a masked mean of the text
tokens -> one conditioning vector; each block: adaLN-modulated self-attention,
cross-attention to the text tokens, adaLN-modulated MLP; adaLN final layer -> unpatchify.
The output is the flow-matching velocity `noise - clean`.

It is a diffusers `ModelMixin` + `ConfigMixin`, so `save_pretrained` / `from_pretrained`
work as for any diffusers model, and it shows the two patterns the seeds require:

- Gradient checkpointing: each block is re-run under
  `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` whenever
  `self.gradient_checkpointing` is set and `torch.is_grad_enabled()`. It is never gated
  on `self.training`: frozen-base LoRA training may run the model in eval mode.
- Attention backends: every `Attention` keeps an `attention_backend` flag and branches on
  it (aitk.models.attention); `set_attention_backend()` validates and propagates the flag.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn
from torch.utils.checkpoint import checkpoint

from aitk.models.attention import attention, check_backend


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of timesteps on the 0..1000 scale, (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32,
                                                           device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_2d(h: int, w: int, dim: int, device: torch.device) -> torch.Tensor:
    """Fixed 2-D positions for an h x w token grid, (h*w, dim); any aspect ratio works."""
    quarter = dim // 4
    freqs = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float32, device=device)
                             / quarter))
    ys = torch.arange(h, dtype=torch.float32, device=device)[:, None] * freqs[None]
    xs = torch.arange(w, dtype=torch.float32, device=device)[:, None] * freqs[None]
    ys = ys[:, None, :].expand(h, w, quarter)
    xs = xs[None, :, :].expand(h, w, quarter)
    pos = torch.cat([ys.sin(), ys.cos(), xs.sin(), xs.cos()], dim=-1).reshape(h * w, -1)
    return F.pad(pos, (0, dim - pos.shape[-1]))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class Attention(nn.Module):
    """Multi-head attention with separate q/k/v/out Linear layers (LoRA targets)."""

    def __init__(self, dim: int, heads: int, context_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        kv_dim = dim if context_dim is None else context_dim
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(kv_dim, dim)
        self.to_v = nn.Linear(kv_dim, dim)
        self.to_out = nn.Linear(dim, dim)
        self.attention_backend = "native"  # branch flag; see aitk.models.attention

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        ctx = x if context is None else context
        b, lq, d = x.shape
        q = self.to_q(x).view(b, lq, self.heads, -1).transpose(1, 2)
        k = self.to_k(ctx).view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
        v = self.to_v(ctx).view(b, ctx.shape[1], self.heads, -1).transpose(1, 2)
        out = attention(q, k, v, key_mask, backend=self.attention_backend)
        return self.to_out(out.transpose(1, 2).reshape(b, lq, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.cross_attn = Attention(dim, heads, context_dim=dim)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(dim, int(dim * mlp_ratio))
        self.adaLN_modulation = nn.Linear(dim, 6 * dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor, context: torch.Tensor,
                key_mask: torch.Tensor) -> torch.Tensor:
        sh1, sc1, g1, sh2, sc2, g2 = self.adaLN_modulation(F.silu(c)).chunk(6, dim=-1)
        x = x + g1[:, None] * self.attn(modulate(self.norm1(x), sh1, sc1))
        x = x + self.cross_attn(self.norm2(x), context, key_mask)
        return x + g2[:, None] * self.mlp(modulate(self.norm3(x), sh2, sc2))


class ExampleTransformer(ModelMixin, ConfigMixin):
    _supports_gradient_checkpointing = True

    @register_to_config
    def __init__(self, in_channels: int = 4, patch_size: int = 2, hidden_size: int = 64,
                 num_layers: int = 2, num_heads: int = 4, text_dim: int = 64,
                 mlp_ratio: float = 4.0, frequency_dim: int = 128) -> None:
        super().__init__()
        p = patch_size
        self.x_embedder = nn.Linear(in_channels * p * p, hidden_size)
        self.t_embedder = nn.Sequential(nn.Linear(frequency_dim, hidden_size), nn.SiLU(),
                                        nn.Linear(hidden_size, hidden_size))
        self.context_embedder = nn.Linear(text_dim, hidden_size)
        self.pooled_embedder = nn.Linear(hidden_size, hidden_size)
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio)
                                    for _ in range(num_layers))
        self.norm_out = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.adaLN_out = nn.Linear(hidden_size, 2 * hidden_size)
        self.proj_out = nn.Linear(hidden_size, p * p * in_channels)
        # Read by forward; set by enable_gradient_checkpointing() or directly.
        self.gradient_checkpointing = False

    def set_attention_backend(self, backend: str) -> None:
        """"native" (SDPA) or "flash"; validated first, then set on every Attention."""
        check_backend(backend)
        for module in self.modules():
            if isinstance(module, Attention):
                module.attention_backend = backend

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """latents (B, C, H, W), timestep (B,) on 0..1000, text (B, L, Dt), mask (B, L)."""
        b, c, h, w = hidden_states.shape
        p = self.config.patch_size
        if h % p or w % p:
            raise ValueError(f"latent size {h}x{w} is not a multiple of patch size {p}")
        gh, gw = h // p, w // p
        tokens = (hidden_states.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
                  .reshape(b, gh * gw, c * p * p))
        x = self.x_embedder(tokens)
        x = x + sincos_2d(gh, gw, x.shape[-1], x.device).to(x.dtype)[None]

        if encoder_attention_mask is None:
            encoder_attention_mask = torch.ones(encoder_hidden_states.shape[:2],
                                                dtype=torch.bool, device=x.device)
        context = self.context_embedder(encoder_hidden_states)
        weights = encoder_attention_mask.to(context.dtype)[..., None]
        pooled = (context * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        t = timestep.reshape(-1).expand(b) if timestep.numel() == 1 else timestep
        t_freq = timestep_embedding(t, self.config.frequency_dim).to(x.dtype)
        cond = self.t_embedder(t_freq) + self.pooled_embedder(pooled)

        for block in self.blocks:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, cond, context, encoder_attention_mask,
                               use_reentrant=False)
            else:
                x = block(x, cond, context, encoder_attention_mask)

        shift, scale = self.adaLN_out(F.silu(cond)).chunk(2, dim=-1)
        x = self.proj_out(modulate(self.norm_out(x), shift, scale))
        return (x.reshape(b, gh, gw, c, p, p).permute(0, 3, 1, 4, 2, 5)
                .reshape(b, c, h, w))
