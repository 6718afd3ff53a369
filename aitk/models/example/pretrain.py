"""A short deterministic pre-training for the example model, on generated shapes.

A random-initialised VAE decodes everything to noise, so previews of a LoRA trained on
it show nothing. This teaches, in about 33 minutes of one CPU core:

1. the VAE to reconstruct pictures of plain coloured shapes, some with dotted
   backgrounds, from its latent mean (the trainer encodes to the mean too; sampling
   noise would only slow this down), then sets its `scaling_factor` so latents have
   unit variance;
2. the transformer to draw the scene asked for (flow matching on the VAE's latents,
   conditioned on the frozen text encoder's embeds of "a red circle on a blue
   background", "a green square"...), always flat: dots are what the example LoRA
   teaches, so its previews change visibly.

The result ships in the repository (aitk/models/example/base/, see its README) so the
example job needs no pre-training; this module is how it was made. Same seed, same
weights on the same torch and CPU: it runs single-threaded (thread counts change the
last bits of CPU sums; on a busy machine one thread is also the fastest). Progress lines
go to `report`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from aitk.diffusion.flow_matching import flow_matching_loss
from aitk.diffusion.timesteps import sample_timesteps
from aitk.models.example.shapes import dot_backgrounds, shape_images


@dataclass(frozen=True)
class PretrainPlan:
    """The default recipe (`python -m aitk example-model DIR --pretrain`)."""

    images: int = 2048
    image_size: int = 64
    vae_steps: int = 6000
    vae_batch: int = 16
    vae_crop: int = 32  # the VAE is convolutional: crops smaller than the image work too
    vae_lr: float = 3e-3
    vae_dotted: float = 0.6  # share of the VAE's pictures with a dotted background
    latent_l2: float = 1e-4  # keeps the latent mean bounded (the KL term's job)
    transformer_steps: int = 6000
    transformer_batch: int = 32
    transformer_lr: float = 1.5e-3
    caption_dropout: float = 0.1  # empty prompts too, so guidance has an unconditional
    warmup: float = 0.05  # share of each stage's steps spent warming the lr up


def training_data(plan: PretrainPlan, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(flat pictures for the transformer, the same with some dotted backgrounds for
    the VAE, captions): everything the pre-training learns from."""
    images, captions = shape_images(plan.images, plan.image_size, seed=seed)
    return images, dot_backgrounds(images, plan.vae_dotted, seed=seed), captions


def training_data_digest(plan: PretrainPlan, seed: int) -> str:
    """sha256 of `training_data`: a shipped base records it, so a test sees when the
    data generator changed and the base no longer matches the code that made it."""
    images, dotted, captions = training_data(plan, seed)
    digest = hashlib.sha256(images.tobytes())
    digest.update(dotted.tobytes())
    digest.update("\n".join(captions).encode())
    return digest.hexdigest()


def _schedule(opt: torch.optim.Optimizer, steps: int, warmup: float):
    from diffusers.optimization import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(opt, int(steps * warmup), steps)


def _to_pixels(images) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def pretrain_vae(vae, pixels: torch.Tensor, plan: PretrainPlan, gen: torch.Generator,
                 report: Callable[[str], None]) -> None:
    opt = torch.optim.Adam(vae.parameters(), lr=plan.vae_lr)
    sched = _schedule(opt, plan.vae_steps, plan.warmup)
    vae.train()
    c = plan.vae_crop
    for step in range(plan.vae_steps):
        idx = torch.randint(len(pixels), (plan.vae_batch,), generator=gen)
        y, x = (int(v) for v in torch.randint(pixels.shape[-1] - c + 1, (2,), generator=gen))
        batch = pixels[idx, :, y:y + c, x:x + c]
        mean = vae.encode(batch).latent_dist.mean
        recon = vae.decode(mean).sample
        error = recon - batch
        # L1 keeps flat colours exact, the squared term pulls large errors in fast.
        loss = (error.abs().mean() + error.pow(2).mean()
                + plan.latent_l2 * mean.pow(2).mean())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % 500 == 0 or step == 0:
            report(f"pre-training the VAE: step {step + 1}/{plan.vae_steps}, "
                   f"loss {loss.item():.4f}")
    vae.eval()


@torch.no_grad()
def encode_latents(vae, pixels: torch.Tensor) -> torch.Tensor:
    return torch.cat([vae.encode(chunk).latent_dist.mean for chunk in pixels.split(64)])


def pretrain_transformer(transformer, latents: torch.Tensor, context: torch.Tensor,
                         mask: torch.Tensor, plan: PretrainPlan, gen: torch.Generator,
                         report: Callable[[str], None]) -> None:
    """Flow matching: x_t = (1 - s) x + s noise, target noise - x, t = 1000 s."""
    opt = torch.optim.AdamW(transformer.parameters(), lr=plan.transformer_lr,
                            weight_decay=0.0)
    sched = _schedule(opt, plan.transformer_steps, plan.warmup)
    transformer.train()
    for step in range(plan.transformer_steps):
        idx = torch.randint(len(latents), (plan.transformer_batch,), generator=gen)
        x = latents[idx]
        noise = torch.randn(x.shape, generator=gen)
        t = sample_timesteps(len(idx), gen)
        s = (t / 1000.0)[:, None, None, None]
        pred = transformer(x * (1 - s) + noise * s, t, context[idx], mask[idx])
        loss = flow_matching_loss(pred, noise - x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 500 == 0 or step == 0:
            report(f"pre-training the transformer: step {step + 1}/{plan.transformer_steps}, "
                   f"loss {loss.item():.4f}")
    transformer.eval()


def pretrain(vae, transformer, text_encoder, tokenizer, plan: PretrainPlan, seed: int,
             report: Callable[[str], None], max_tokens: int) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _pretrain(vae, transformer, text_encoder, tokenizer, plan, seed, report, max_tokens)
    finally:
        torch.set_num_threads(threads)


def _pretrain(vae, transformer, text_encoder, tokenizer, plan: PretrainPlan, seed: int,
              report: Callable[[str], None], max_tokens: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    images, dotted, captions = training_data(plan, seed)
    pixels = _to_pixels(images)
    pretrain_vae(vae, _to_pixels(dotted), plan, gen, report)
    latents = encode_latents(vae, pixels)
    vae.register_to_config(scaling_factor=float(1.0 / latents.std()))
    latents = latents * vae.config.scaling_factor

    drop = torch.rand(len(captions), generator=gen) < plan.caption_dropout
    prompts = ["" if d else c for c, d in zip(captions, drop.tolist(), strict=True)]
    tokens = tokenizer(prompts, padding=True, truncation=True, max_length=max_tokens,
                       return_tensors="pt")
    with torch.no_grad():
        context = text_encoder(input_ids=tokens.input_ids,
                               attention_mask=tokens.attention_mask).last_hidden_state
    pretrain_transformer(transformer, latents, context, tokens.attention_mask.bool(), plan,
                         gen, report)
