"""SD1Model and SD2Model: the `sd1` (alias `sd15`; upstream's default when no `is_*` flag
is set) and `sd2` (`is_v2: true`) archs, on diffusers' Stable Diffusion classes.

`name_or_path` is a diffusers folder or hub id (e.g.
`stable-diffusion-v1-5/stable-diffusion-v1-5`, `stabilityai/stable-diffusion-2-1`),
loaded part by part with `from_pretrained`:

    unet/          UNet2DConditionModel (epsilon; v-prediction for SD 2.x 768-v)
    vae/           AutoencoderKL; latents = mean * scaling_factor (0.18215)
    text_encoder/  CLIPTextModel -> the last hidden states after the final layer norm
                   (77, 768) for 1.x, (77, 1024) for 2.x, whose diffusers encoder has
                   23 of OpenCLIP-H's 24 layers: SD 2 reads the penultimate one
    tokenizer/     CLIPTokenizer (77 tokens, padded to the full context, as the
                   StableDiffusionPipeline embeds a prompt)
    scheduler/     the sampler's config; training reads its betas and prediction type

`model_kwargs: {variant: fp16}` loads the `*.fp16.safetensors` weight files. Prompt
embeds per item: `text_embeds` (77, D). Training, latents, LoRA layout and the text
encoder's LoRA are what the UNet archs share (aitk.models.unet); the kohya prefix of the
text encoder is `lora_te_` for both versions (ComfyUI maps it onto 1.x's clip_l and
2.x's clip_h). A 2.x folder's scheduler config says v-prediction (768-v) or epsilon
(base); `model.is_v_pred` overrides it, as for sdxl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from PIL import Image

from aitk.errors import ModelLoadError
from aitk.models import kohya
from aitk.models.base import GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.unet import (
    TE_QUANT_EXCLUDE,
    UNET_QUANT_EXCLUDE,
    UNetModel,
    attention_prefixes,
    prediction_overrides,
    tensor_to_pil,
)

PARTS = ("unet", "vae", "text_encoder", "tokenizer", "scheduler")


class SD1Model(UNetModel):
    arch = "sd1"
    message_name: ClassVar[str] = "SD 1.x"  # how load errors name the model
    kohya_layout = kohya.KohyaLayout("SD 1.x", {"text_encoder": "lora_te_"})

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.stable_diffusion.tiny import SD1, build_tiny_sd

        build_tiny_sd(target, SD1, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        import diffusers
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTokenizer

        from aitk.models.loading import check_source, freeze, load_part, load_scheduler

        name, arch = str(self.model_config.name_or_path), self.message_name
        check_source(name, arch, PARTS)
        variant = self.model_kwargs.variant
        weights = {"variant": variant} if variant else {}

        def part(cls: Any, sub: str, **kw: Any) -> Any:
            return load_part(cls, name, sub, arch, **kw)

        unet = part(UNet2DConditionModel, "unet", torch_dtype=self.dtype, **weights)
        text_encoder = part(CLIPTextModel, "text_encoder", dtype=self.dtype, **weights)
        tokenizer = part(CLIPTokenizer, "tokenizer")
        # The VAE stays float32, as for SDXL: decoding in half precision can overflow.
        vae = part(AutoencoderKL, "vae", torch_dtype=torch.float32, **weights)
        scheduler = load_scheduler(name, arch, diffusers.DDIMScheduler,
                                   **prediction_overrides(self.model_config))

        freeze(unet, text_encoder, vae)
        self.model, self.vae, self.noise_scheduler = unet, vae, scheduler
        self.text_encoder, self.tokenizer = text_encoder, tokenizer
        self.lora_block_prefixes = attention_prefixes(unet)
        self.place_loaded([unet], idle=[vae, text_encoder])
        self.quantize_transformer(unet, exclude=UNET_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder, exclude=TE_QUANT_EXCLUDE)

    # ---- 2. encoders ---------------------------------------------------------------
    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: the text encoder's last hidden states over the padded 77 tokens
        (77, D), as StableDiffusionPipeline.encode_prompt gives them; with gradients
        while the text encoder's LoRA trains."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        tokenizer = self.tokenizer
        ids = tokenizer(list(prompts), padding="max_length", truncation=True,
                        max_length=tokenizer.model_max_length, return_tensors="pt").input_ids
        with self.text_encoder_grad(), self.on_device(self.text_encoder):
            states = self.text_encoder(ids.to(self.device))[0].to(self.dtype)
        return AdvancedPromptEmbeds(text_embeds=[states[i].clone()
                                                 for i in range(len(prompts))])

    # ---- 3. train step -------------------------------------------------------------
    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b = latent_model_input.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        context, _ = embeds.pad("text_embeds")  # all 77 long: no padding happens
        return self.model(latent_model_input.to(self.device, self.dtype),
                          self.unet_timesteps(timestep, b, self.device),
                          encoder_hidden_states=context, return_dict=False)[0]

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import StableDiffusionPipeline

        pipeline = StableDiffusionPipeline(
            vae=self.vae, text_encoder=None, tokenizer=self.tokenizer, unet=self.model,
            scheduler=self.noise_scheduler.__class__.from_config(self.noise_scheduler.config),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        def one(embeds: AdvancedPromptEmbeds) -> torch.Tensor:
            return embeds.select([0]).to(self.device, self.dtype)["text_embeds"][0][None]

        self.check_sample_size(gen_config, f"{self.message_name}: VAE 8 x the UNet's "
                                           "downsampling")
        latents = pipeline(
            prompt_embeds=one(conditional_embeds),
            negative_prompt_embeds=one(unconditional_embeds),
            width=gen_config.width, height=gen_config.height,
            num_inference_steps=gen_config.sample_steps,
            guidance_scale=gen_config.guidance_scale, generator=generator,
            output_type="latent").images
        # Decoded here in float32: the pipeline would hand bf16 latents to the fp32 VAE.
        return tensor_to_pil(self.decode_latents(latents)[0])


class SD2Model(SD1Model):
    """SD 2.x: the same pipeline and layout; a wider (OpenCLIP-H) text encoder, linear
    transformer projections, and v-prediction in the 768-v models' scheduler config."""

    arch = "sd2"
    message_name = "SD 2.x"
    kohya_layout = kohya.KohyaLayout("SD 2.x", {"text_encoder": "lora_te_"})

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.stable_diffusion.tiny import SD2, build_tiny_sd

        build_tiny_sd(target, SD2, seed=seed)
