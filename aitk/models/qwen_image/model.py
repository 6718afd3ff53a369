"""QwenImageModel: the `qwen_image` arch (Qwen-Image, text to image), on diffusers.

`name_or_path`: a diffusers folder or hub id (e.g. Qwen/Qwen-Image) with

    transformer/   QwenImageTransformer2DModel (MMDiT over 2x2-packed latents)
    vae/           AutoencoderKLQwenImage (a video VAE: images get a 1-frame axis)
    text_encoder/  Qwen2_5_VLForConditionalGeneration (only its language model is used)
    tokenizer/     Qwen2Tokenizer
    scheduler/     FlowMatchEulerDiscreteScheduler (dynamic exponential shift)

Conventions at this arch's edges:
- Latents are (B, C, h, w), normalised per channel with the VAE's `latents_mean` /
  `latents_std`; the frame axis exists only inside encode/decode.
- Prompts go through Qwen's chat template; the hidden states of the template's own
  leading tokens are dropped, so each prompt embeds as (L, D) of its own tokens plus
  the template's closing tokens (the same slice diffusers' pipeline makes).
- The transformer takes timesteps as t / 1000 and the packed latents with `img_shapes`.
- Training: flow matching with the model's own scheduler shift (`shift` /
  `flux_shift` timestep types: exponential, mu over 256..8192 image tokens).
- LoRA files: `diffusion_model.` + diffusers module names with alpha, the layout both
  diffusers' QwenImagePipeline.load_lora_weights and ComfyUI read.
- Image sides are multiples of 32 (VAE 8 x packing 2, x 2 as upstream buckets them).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ClassVar

import torch
from PIL import Image

from aitk.adapters.keys import from_public_keys, to_public_keys
from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.diffusion.timesteps import FlowShift
from aitk.errors import ModelLoadError
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.loading import freeze, load_part
from aitk.models.offload import visiting
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.qwen_image import latents as latent_space

PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
MAX_PROMPT_TOKENS = 1024
# Kept in the float dtype by quantization: input/time embedders and the output layers.
TRANSFORMER_QUANT_EXCLUDE = ("img_in", "txt_in", "txt_norm", "time_text_embed*",
                             "norm_out*", "proj_out")
# The text encoder's LM head (unused) and vision tower (dropped for text to image).
TE_QUANT_EXCLUDE = ("lm_head", "model.visual*")


class QwenImageModel(BaseModel):
    arch = "qwen_image"
    use_old_lokr_format = False
    lora_block_prefixes = ("transformer_blocks.",)
    # The edit archs (aitk.models.qwen_image_edit) show the text encoder images.
    keep_vision_tower: ClassVar[bool] = False

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.qwen_image.tiny import build_tiny_qwen_image

        build_tiny_qwen_image(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKLQwenImage,
            FlowMatchEulerDiscreteScheduler,
            QwenImageTransformer2DModel,
        )
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        cfg = self.model_config
        name = str(cfg.name_or_path)
        transformer = self.load_denoiser(QwenImageTransformer2DModel, name, "transformer",
                                         TRANSFORMER_QUANT_EXCLUDE, dtype=self.dtype)
        text_encoder = self.load_text_encoder(Qwen2_5_VLForConditionalGeneration, name,
                                              "text_encoder", TE_QUANT_EXCLUDE,
                                              dtype=self.dtype)
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", self.arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKLQwenImage, name, "vae", self.arch,
                        dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", self.arch)
        # Text to image never shows the encoder an image: drop its vision tower (and
        # the memory and slow Conv3d it carries).
        if not self.keep_vision_tower:
            drop_vision_tower(text_encoder)
        freeze(transformer, text_encoder, vae)
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.vae, self.noise_scheduler = vae, scheduler
        prefix = PROMPT_TEMPLATE.split("{}")[0]
        self.template_drop = len(tokenizer(prefix).input_ids)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder, exclude=TE_QUANT_EXCLUDE)

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return latent_space.vae_scale_factor(self.vae)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return latent_space.encode_images(self, images)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return latent_space.decode_latents(self, latents)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D) tensor per prompt: the last hidden states of its real tokens,
        the template's leading tokens dropped."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        texts = [PROMPT_TEMPLATE.format(p) for p in prompts]
        tokens = self.tokenizer(texts, max_length=MAX_PROMPT_TOKENS + self.template_drop,
                                padding=True, truncation=True, return_tensors="pt")
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            ids, mask = tokens.input_ids.to(where), tokens.attention_mask.to(where)
            states = te(input_ids=ids, attention_mask=mask,
                        output_hidden_states=True).hidden_states[-1]
        items = [states[i][mask[i].bool()][self.template_drop:] for i in range(len(texts))]
        return AdvancedPromptEmbeds(
            text_embeds=[t.to(self.device, self.dtype).clone() for t in items])

    @property
    def text_embedding_space_version(self) -> str:
        return "qwen_image-1"

    @property
    def latent_space_version(self) -> str:
        return "qwen_image-1"

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        return FlowMatchSchedule(settings, FlowShift.from_scheduler_config(
            self.noise_scheduler.config), image_tokens(self.model.config.patch_size))

    pack = staticmethod(latent_space.pack)
    unpack = staticmethod(latent_space.unpack)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b, _, h, w = latent_model_input.shape
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        context, mask = embeds.pad("text_embeds")
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        out = self.model(
            hidden_states=self.pack(latent_model_input.to(self.device, self.dtype)),
            encoder_hidden_states=context, encoder_hidden_states_mask=mask.long(),
            timestep=(t / 1000.0).to(self.dtype), img_shapes=[[(1, h // 2, w // 2)]] * b,
            return_dict=False)[0]
        return self.unpack(out, h, w)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = QwenImagePipeline(scheduler=scheduler, vae=self.vae, text_encoder=None,
                                     tokenizer=None, transformer=self.model)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        return run_pipeline(pipeline, gen_config, conditional_embeds, unconditional_embeds,
                            generator, self.device, self.dtype, self.vae if self.low_vram
                            else None)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return to_public_keys(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return from_public_keys(state_dict)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * self.model.config.patch_size * 2


def padded(embeds: AdvancedPromptEmbeds, device: torch.device, dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor]:
    context, mask = embeds.to(device, dtype).pad("text_embeds")
    return context, mask.long()


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype,
                 offloaded_vae: torch.nn.Module | None = None, image: Any = None
                 ) -> Image.Image:
    """One image from diffusers' QwenImagePipeline, called with embeds only. Shared by
    the trainer's previews and the interop tests (the same call on a pipeline that
    loaded the LoRA file through diffusers). The edit pipelines also take `image`, the
    control image(s)."""
    cond, cond_mask = padded(conditional, device, dtype)
    kwargs: dict[str, Any] = {} if image is None else {"image": image}
    if gen_config.guidance_scale > 1.0:  # true CFG against the negative prompt
        neg, neg_mask = padded(unconditional, device, dtype)
        kwargs.update(negative_prompt_embeds=neg, negative_prompt_embeds_mask=neg_mask)
    vae_context = (contextlib.nullcontext() if offloaded_vae is None
                   else visiting(offloaded_vae, device))
    with vae_context:
        return pipeline(prompt_embeds=cond, prompt_embeds_mask=cond_mask,
                        true_cfg_scale=gen_config.guidance_scale, width=gen_config.width,
                        height=gen_config.height, num_inference_steps=gen_config.sample_steps,
                        generator=generator, output_type="pil", **kwargs).images[0]


def drop_vision_tower(text_encoder: torch.nn.Module) -> None:
    """Qwen2.5-VL without its vision tower: text to image never shows it an image (its
    memory and slow Conv3d go; the description's `kept_params` counts what is left)."""
    text_encoder.model.visual = None
