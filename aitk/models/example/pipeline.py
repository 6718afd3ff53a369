"""The example arch's sampler: embeds in, pixels out (never text).

Flow-matching Euler steps through diffusers' `FlowMatchEulerDiscreteScheduler` (a fresh
copy per image, because a scheduler keeps its step index) with classifier-free guidance:
the unconditional and conditional embeds are concatenated into one batch of two and
padded only here, at the model call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from aitk.models.prompt_embeds import AdvancedPromptEmbeds

# (latents, timestep 0..1000, embeds) -> velocity; ExampleModel.get_noise_prediction.
PredictFn = Callable[[torch.Tensor, torch.Tensor, AdvancedPromptEmbeds], torch.Tensor]


class ExamplePipeline:
    def __init__(self, predict: PredictFn, decode: Callable[[torch.Tensor], torch.Tensor],
                 scheduler_config: dict, latent_channels: int, vae_scale_factor: int,
                 divisibility: int, device: torch.device, dtype: torch.dtype) -> None:
        self.predict = predict
        self.decode = decode
        self.scheduler_config = scheduler_config
        self.latent_channels = latent_channels
        self.vae_scale_factor = vae_scale_factor
        self.divisibility = divisibility  # vae factor * patch size
        self.device = device
        self.dtype = dtype

    @torch.no_grad()
    def __call__(self, conditional: AdvancedPromptEmbeds,
                 unconditional: AdvancedPromptEmbeds | None, *, width: int, height: int,
                 num_inference_steps: int, guidance_scale: float,
                 generator: torch.Generator) -> torch.Tensor:
        """Returns pixels (1, 3, height, width) in [-1, 1]."""
        f, d = self.vae_scale_factor, self.divisibility
        if width % d or height % d:
            raise ValueError(f"sample size {width}x{height} must be a multiple of {d}")
        shape = (1, self.latent_channels, height // f, width // f)
        # Noise on the CPU generator so a seed gives the same image on every device.
        latents = torch.randn(shape, generator=generator, dtype=torch.float32)
        latents = latents.to(self.device)
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        scheduler.set_timesteps(num_inference_steps, device=self.device)
        use_cfg = unconditional is not None and guidance_scale > 1.0
        embeds = unconditional.concat(conditional) if use_cfg else conditional
        for t in scheduler.timesteps:
            model_in = torch.cat([latents, latents]) if use_cfg else latents
            timestep = t.to(torch.float32).expand(model_in.shape[0])
            pred = self.predict(model_in.to(self.dtype), timestep, embeds).float()
            if use_cfg:
                uncond, cond = pred.chunk(2)
                pred = uncond + guidance_scale * (cond - uncond)
            latents = scheduler.step(pred, t, latents, return_dict=False)[0]
        return self.decode(latents).clamp(-1.0, 1.0)
