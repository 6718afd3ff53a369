"""SDXLModel: the `sdxl` arch (upstream `is_xl: true`), on diffusers' SDXL classes.

`name_or_path` is a diffusers SDXL folder or hub id (e.g.
`stabilityai/stable-diffusion-xl-base-1.0`), loaded part by part with `from_pretrained`:

    unet/            UNet2DConditionModel (epsilon or v-prediction)
    vae/             AutoencoderKL; latents = mean * scaling_factor (SDXL: 0.13025)
    text_encoder/    CLIPTextModel       -> penultimate hidden states (L, 768)
    text_encoder_2/  CLIPTextModelWithProjection -> penultimate states (L, 1280) and
                     the projected pooled embedding (1280)
    tokenizer/, tokenizer_2/  CLIPTokenizer (77 tokens, padded to the full context:
                     SDXL was trained on the padded sequence, so its pad tokens count)
    scheduler/       the sampler's config; training reads its betas and prediction type

`model_kwargs: {variant: fp16}` loads the `*.fp16.safetensors` weight files (half the
download of the hub's full-precision files).

Prompt embeds per item: `text_embeds` (77, 768 + 1280) and `pooled_embeds` (1, 1280).
Training: what the UNet archs share (aitk.models.unet: DDPM noise with the scheduler
config's prediction type, `model.is_v_pred` overriding it, Min-SNR, kohya LoRA files
with `lora_te1_`/`lora_te2_` for the text encoders' LoRA). The UNet's added conditioning
`time_ids` = original size, crop top-left, target size, all (height, width), from the
batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from aitk.errors import ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.sdxl.lora_keys import LAYOUT
from aitk.models.unet import (
    TE_QUANT_EXCLUDE,
    UNET_QUANT_EXCLUDE,
    UNetModel,
    attention_prefixes,
    prediction_overrides,
    tensor_to_pil,
)

PARTS = ("unet", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
         "scheduler")
MESSAGE_NAME = "SDXL"  # how load errors name this arch, as they always have

Size = tuple[int, int]  # (height, width), the order SDXL's time ids use


def time_ids(original_size: Size, crop_top_left: Size, target_size: Size) -> list[float]:
    """SDXL's micro-conditioning for one image: (orig h, orig w, crop top, crop left,
    target h, target w), in pixels."""
    return [float(v) for v in (*original_size, *crop_top_left, *target_size)]


def batch_time_ids(batch: Any, target_size: Size, count: int) -> torch.Tensor:
    """(count, 6) time ids; items without a recorded source size or crop were not
    resized or cropped (original = target, crop (0, 0)), as SDXL's sampler assumes."""
    originals = getattr(batch, "original_sizes", None) or [target_size] * count
    crops = getattr(batch, "crop_coords_top_left", None) or [(0, 0)] * count
    if len(originals) != count or len(crops) != count:
        raise ValueError(f"the batch carries {len(originals)} sizes and {len(crops)} crops "
                         f"for {count} latents")
    return torch.tensor([time_ids(tuple(o), tuple(c), target_size)
                         for o, c in zip(originals, crops, strict=True)])


class SDXLModel(UNetModel):
    arch = "sdxl"
    text_encoder_subfolders = ("text_encoder", "text_encoder_2")
    kohya_layout = LAYOUT
    # train.prompt_dropout_prob blanks each encoder's prompt on its own, as upstream's
    # encode_prompts_xl (get_prompt_embeds_dropped)
    prompt_dropout_encoders = len(text_encoder_subfolders)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text_encoder_2: nn.Module | None = None
        self.tokenizer_2: Any = None
        self.force_zeros_for_empty_prompt = True

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.sdxl.tiny import build_tiny_sdxl

        build_tiny_sdxl(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        import diffusers
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

        from aitk.models.loading import check_source, freeze, load_part, load_scheduler

        name = str(self.model_config.name_or_path)
        check_source(name, MESSAGE_NAME, PARTS)
        # `model_kwargs: {variant: fp16}` reads the hub's half-size weight files.
        variant = self.model_kwargs.variant
        weights = {"variant": variant} if variant else {}

        def part(cls: Any, sub: str, **kw: Any) -> Any:
            return load_part(cls, name, sub, MESSAGE_NAME, **kw)

        unet = part(UNet2DConditionModel, "unet", torch_dtype=self.dtype, **weights)
        text_encoder = part(CLIPTextModel, "text_encoder", dtype=self.dtype, **weights)
        text_encoder_2 = part(CLIPTextModelWithProjection, "text_encoder_2",
                              dtype=self.dtype, **weights)
        tokenizer = part(CLIPTokenizer, "tokenizer")
        tokenizer_2 = part(CLIPTokenizer, "tokenizer_2")
        # The VAE stays float32: SDXL's VAE overflows in float16.
        vae = part(AutoencoderKL, "vae", torch_dtype=torch.float32, **weights)
        scheduler = load_scheduler(name, MESSAGE_NAME, diffusers.EulerDiscreteScheduler,
                                   **prediction_overrides(self.model_config))

        freeze(unet, text_encoder, text_encoder_2, vae)
        self.model, self.vae, self.noise_scheduler = unet, vae, scheduler
        self.text_encoder, self.text_encoder_2 = text_encoder, text_encoder_2
        self.tokenizer, self.tokenizer_2 = tokenizer, tokenizer_2
        self.lora_block_prefixes = attention_prefixes(unet)
        if Path(name).expanduser().is_dir():
            index = Path(name).expanduser() / "model_index.json"
            if index.is_file():
                import json

                self.force_zeros_for_empty_prompt = bool(json.loads(index.read_text()).get(
                    "force_zeros_for_empty_prompt", True))
        self.place_loaded([unet], idle=[vae, text_encoder, text_encoder_2])

        self.quantize_transformer(unet, exclude=UNET_QUANT_EXCLUDE)
        for te in (text_encoder, text_encoder_2):
            self.quantize_text_encoder(te, exclude=TE_QUANT_EXCLUDE)

    # ---- 2. encoders ---------------------------------------------------------------
    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: both encoders' penultimate states over the padded 77 tokens,
        concatenated (77, D1 + D2), and encoder 2's projected pooled embedding (1, P);
        with gradients while the text encoders' LoRA trains."""
        return self._embed(list(prompts), list(prompts))

    def get_prompt_embeds_dropped(self, prompts: list[str],
                                  blanks: Sequence[Sequence[bool]]) -> AdvancedPromptEmbeds:
        """Each encoder's prompt blanked on its own (upstream's encode_prompts_xl with
        `dropout_prob`): a row's first draw makes encoder 1's part its embedding of "",
        the second encoder 2's part and the pooled embedding (encoder 2's)."""
        rows = list(zip(prompts, blanks, strict=True))
        return self._embed(["" if row[0] else p for p, row in rows],
                           ["" if row[1] else p for p, row in rows])

    def _embed(self, prompts: list[str], prompts_2: list[str]) -> AdvancedPromptEmbeds:
        """`prompts` through encoder 1, `prompts_2` through encoder 2."""
        if self.text_encoder is None or self.text_encoder_2 is None:
            raise ModelLoadError("the text encoders are unloaded (text embeddings cached)")
        states = []
        pooled = None
        with self.text_encoder_grad(), self.on_device(self.text_encoder,
                                                       self.text_encoder_2):
            for tokenizer, encoder, texts in ((self.tokenizer, self.text_encoder, prompts),
                                              (self.tokenizer_2, self.text_encoder_2,
                                               prompts_2)):
                ids = tokenizer(texts, padding="max_length", truncation=True,
                                max_length=tokenizer.model_max_length,
                                return_tensors="pt").input_ids
                out = encoder(ids.to(self.device), output_hidden_states=True)
                states.append(out.hidden_states[-2])
                pooled = out.text_embeds if encoder is self.text_encoder_2 else pooled
        text = torch.cat(states, dim=-1).to(self.dtype)
        return AdvancedPromptEmbeds(
            text_embeds=[text[i].clone() for i in range(len(prompts))],
            pooled_embeds=[pooled[i:i + 1].to(self.dtype).clone()
                           for i in range(len(prompts))])

    def unload_text_encoder(self) -> None:
        self.text_encoder = self.text_encoder_2 = None

    # ---- 3. train step -------------------------------------------------------------
    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b, _, h, w = latent_model_input.shape
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        context, _ = embeds.pad("text_embeds")  # all 77 long: no padding happens
        pooled = torch.cat(embeds["pooled_embeds"])
        f = self.vae_scale_factor
        ids = batch_time_ids(batch, (h * f, w * f), b).to(self.device, self.dtype)
        t = self.unet_timesteps(timestep, b, self.device)
        return self.model(latent_model_input.to(self.device, self.dtype), t,
                          encoder_hidden_states=context,
                          added_cond_kwargs={"text_embeds": pooled, "time_ids": ids},
                          return_dict=False)[0]

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import StableDiffusionXLPipeline

        pipeline = StableDiffusionXLPipeline(
            vae=self.vae, text_encoder=None, text_encoder_2=None, tokenizer=self.tokenizer,
            tokenizer_2=self.tokenizer_2, unet=self.model,
            scheduler=self.noise_scheduler.__class__.from_config(self.noise_scheduler.config),
            force_zeros_for_empty_prompt=self.force_zeros_for_empty_prompt,
            add_watermarker=False)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        cond = pipeline_embeds(conditional_embeds, self.device, self.dtype)
        uncond = pipeline_embeds(unconditional_embeds, self.device, self.dtype)
        if self.force_zeros_for_empty_prompt and not gen_config.negative_prompt:
            # What diffusers' SDXL pipeline does for an empty negative prompt.
            uncond = tuple(torch.zeros_like(t) for t in uncond)
        self.check_sample_size(gen_config, "SDXL: VAE 8 x the UNet's downsampling")
        latents = pipeline(
            prompt_embeds=cond[0], pooled_prompt_embeds=cond[1],
            negative_prompt_embeds=uncond[0], negative_pooled_prompt_embeds=uncond[1],
            width=gen_config.width, height=gen_config.height,
            num_inference_steps=gen_config.sample_steps,
            guidance_scale=gen_config.guidance_scale, generator=generator,
            output_type="latent").images
        # Decoded here in float32: the pipeline would hand bf16 latents to the fp32 VAE.
        return tensor_to_pil(self.decode_latents(latents)[0])


def pipeline_embeds(embeds: AdvancedPromptEmbeds, device: torch.device, dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """One item's embeds as the pipeline takes them: (1, 77, D) and (1, P)."""
    one = embeds.select([0]).to(device, dtype)
    return one["text_embeds"][0][None], one["pooled_embeds"][0]
