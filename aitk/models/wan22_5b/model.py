"""Wan 2.2 TI2V 5B on diffusers: `wan22_5b`, one 5B transformer on the Wan 2.2 VAE, text
to video and (in previews) image to video, built on the Wan 2.1 code
(aitk.models.wan21.model): the same UMT5 prompts, flow matching, LoRA layout and
pipeline call.

`name_or_path`: a diffusers folder or hub id (Wan-AI/Wan2.2-TI2V-5B-Diffusers) with

    transformer/     WanTransformer3DModel: 48 latent channels in and out, patch (1, 2, 2)
    vae/             AutoencoderKLWan, the 2.2 kind: pixels patchified 2x2 first, then
                     16x space and 4x time in all (F = 4k + 1 frames), z_dim 48
    text_encoder/, tokenizer/, scheduler/   as Wan 2.1 (UniPC, flow_shift 5.0)

What differs from Wan 2.1 at this arch's edges:
- Sides are multiples of 32 (VAE 16 x patch 2); latents (B, 48, (F - 1) / 4 + 1,
  H / 16, W / 16), normalised per channel with the VAE config's mean and std.
- Training is text to video (upstream's default). Training shift: the scheduler
  config's `flow_shift` (5.0 in the released repo, upstream's training shift).
- Previews: WanPipeline with `expand_timesteps` (one timestep per latent token, as the
  5B repo's model_index says). A sample with `ctrl_img` is image to video:
  WanImageToVideoPipeline with `expand_timesteps`, which puts the picture's VAE latents
  in place of the first latent frame, holds them there at timestep 0 and denoises the
  rest, the TI2V way; no CLIP image encoder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aitk.models.base import GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.wan21.model import Wan21Model, preview_first_frame, run_pipeline
from aitk.models.wan22_5b.tiny import build_tiny_wan22_5b


class Wan22_5BModel(Wan21Model):
    arch = "wan22_5b"

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        build_tiny_wan22_5b(target, seed=seed)

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        """16: the 2.2 VAE's 2x2 patchify times its 8x downsampling (its config says so;
        Wan 2.1's count of temporal stages would say 8)."""
        return int(self.vae.config.scale_factor_spatial)

    @property
    def latent_space_version(self) -> str:
        return "wan-2.2-vae"  # 48 channels, 16x: never share a latent cache with 2.1's

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import WanPipeline

        pipeline = WanPipeline(tokenizer=None, text_encoder=None, vae=self.vae,
                               scheduler=self.fresh_scheduler(), transformer=self.model,
                               transformer_2=None, boundary_ratio=None,
                               expand_timesteps=True)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def first_frame_pipeline(self) -> Any:
        """Image to video the TI2V way: the picture's latents are the first latent frame."""
        from diffusers import WanImageToVideoPipeline

        pipeline = WanImageToVideoPipeline(
            tokenizer=None, text_encoder=None, vae=self.vae, scheduler=self.fresh_scheduler(),
            image_encoder=None, image_processor=None, transformer=self.model,
            transformer_2=None, boundary_ratio=None, expand_timesteps=True)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        inputs: dict[str, Any] = {}
        if gen_config.ctrl_img:
            pipeline = self.first_frame_pipeline()
            inputs["image"] = preview_first_frame(gen_config)
        with self.preview_devices():
            return run_pipeline(pipeline, gen_config, conditional_embeds,
                                unconditional_embeds, generator, self.device, self.dtype,
                                **inputs)
