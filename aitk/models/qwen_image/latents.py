"""The Qwen-Image VAE's latent space, shared by the archs built on that VAE (qwen_image,
qwen_image_edit, krea2): per-channel normalisation, the first-frame axis of its video
VAE, and the 2x2-patch token order of their pipelines (`_pack_latents`)."""

from __future__ import annotations

from typing import Any

import torch


def vae_scale_factor(vae: Any) -> int:
    return 2 ** len(vae.temperal_downsample)


def latent_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = vae.config
    shape = (1, cfg.z_dim, 1, 1)
    mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(shape)
    std = torch.tensor(cfg.latents_std, dtype=torch.float32).view(shape)
    return mean.to(like.device), std.to(like.device)


def encode_images(model: Any, images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in [-1, 1] -> (B, C, H/8, W/8), the distribution's mean, normalised
    per channel. `model` is the BaseModel holding the VAE (its device and dtype)."""
    with torch.no_grad(), model.on_device(model.vae):
        x = images.to(model.device, torch.float32)[:, :, None]
        z = model.vae.encode(x).latent_dist.mean[:, :, 0]
    mean, std = latent_stats(model.vae, z)
    return ((z - mean) / std).to(model.dtype)


def decode_latents(model: Any, latents: torch.Tensor) -> torch.Tensor:
    z = latents.to(model.device, torch.float32)
    mean, std = latent_stats(model.vae, z)
    with torch.no_grad(), model.on_device(model.vae):
        return model.vae.decode((z * std + mean)[:, :, None]).sample[:, :, 0]


def pack(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/2 * w/2, 4C): one token per 2x2 patch."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse of `pack` for a (B, h/2 * w/2, 4C) tensor."""
    b, _, c4 = tokens.shape
    x = tokens.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, h, w)
