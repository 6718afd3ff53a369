"""Latents of a diffusers AutoencoderKL (Flux, Chroma, SDXL, the example arch): the
posterior mean, shifted and scaled by the VAE config, `(z - shift_factor) *
scaling_factor` (SDXL's VAE has no shift: 0). Both directions run in float32 without
autograd; the caller picks the device placement (`BaseModel.on_device`) and the dtype
of the result."""

from __future__ import annotations

from typing import Any

import torch


def encode(vae: Any, pixels: torch.Tensor, device: torch.device) -> torch.Tensor:
    """(B, 3, H, W) in [-1, 1] -> float32 latents (B, C, H/f, W/f). The distribution's
    mean, not a sample: cached latents are then deterministic."""
    cfg = vae.config
    with torch.no_grad():
        dist = vae.encode(pixels.to(device, torch.float32)).latent_dist
    return (dist.mean - (cfg.shift_factor or 0.0)) * cfg.scaling_factor


def decode(vae: Any, latents: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The inverse of `encode`: latents -> float32 pixels (B, 3, H, W) in about [-1, 1]."""
    cfg = vae.config
    z = latents.to(device, torch.float32) / cfg.scaling_factor + (cfg.shift_factor or 0.0)
    with torch.no_grad():
        return vae.decode(z).sample
