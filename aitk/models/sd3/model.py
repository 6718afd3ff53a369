"""SD3Model: Stable Diffusion 3.5 medium and large (arch `sd3`, upstream `is_v3: true`) on
diffusers' SD3 classes.

`name_or_path` is a diffusers folder or hub id (`stabilityai/stable-diffusion-3.5-large`)
with `transformer/ text_encoder/ tokenizer/ text_encoder_2/ tokenizer_2/
text_encoder_3/ tokenizer_3/ vae/ scheduler/`.

- Latents: VAE mean, `(z - shift_factor) * scaling_factor`, (B, 16, H/8, W/8); the
  transformer patchifies them 2x2 itself, so image sides are multiples of 16.
- Text, as StableDiffusion3Pipeline encodes it: both CLIPs' penultimate states over the
  padded 77 tokens, concatenated (77, 768 + 1280) and zero-padded to T5's width, then
  T5's states over `max_sequence_length` padded tokens (256 by default) appended:
  `text_embeds` (77 + 256, 4096) per item. `pooled_embeds` (1, 768 + 1280): both CLIPs'
  projected pooled outputs. No text mask: the model was trained on the padded sequence.
- Timesteps go in on 0..1000 as they are (the transformer's own convention: the
  sampler feeds sigma * 1000).
- Training schedule: flow matching, target `noise - clean`, with the fixed shift of the
  model's scheduler config (3.0) for `timestep_type: shift`.
- LoRA files: `transformer.` + diffusers module names, alpha folded into `lora_B`
  (aitk.adapters.alpha_folding), which diffusers' `StableDiffusion3Pipeline.load_lora_weights`
  and ComfyUI both read; `diffusion_model.` files and files with `.alpha` read back.
- `low_vram`: the text encoders stay on the CPU except while embedding, the VAE except
  while encoding/decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aitk.adapters.alpha_folding import fold_alphas, unfolded_alphas
from aitk.adapters.keys import from_public_keys
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import ModelLoadError
from aitk.models import kl_latents
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
         "text_encoder_3", "tokenizer_3", "vae", "scheduler")
LORA_PREFIX = "transformer."
MESSAGE_NAME = "SD3"
# Kept in float by quantization: the patch/time/text embedders and the output layers.
TRANSFORMER_QUANT_EXCLUDE = ("pos_embed", "pos_embed.*", "context_embedder",
                             "time_text_embed", "time_text_embed.*", "norm_out",
                             "norm_out.*", "proj_out")
TE_QUANT_EXCLUDE = ("*embeddings*", "text_projection")
T5_TOKENS = 256  # StableDiffusion3Pipeline's max_sequence_length default, upstream's too
class SD3Model(BaseModel):
    arch = "sd3"
    use_old_lokr_format = False
    lora_block_prefixes = ("transformer_blocks.",)

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.sd3.tiny import build_tiny_sd3

        build_tiny_sd3(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
        from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

        from aitk.models.loading import check_source, freeze, load_part

        name = str(self.model_config.name_or_path)
        check_source(name, MESSAGE_NAME, PARTS)

        def part(cls: Any, sub: str, **kw: Any) -> Any:
            return load_part(cls, name, sub, MESSAGE_NAME, **kw)

        transformer = part(SD3Transformer2DModel, "transformer", torch_dtype=self.dtype)
        encoders = [part(CLIPTextModelWithProjection, "text_encoder", dtype=self.dtype),
                    part(CLIPTextModelWithProjection, "text_encoder_2", dtype=self.dtype),
                    part(T5EncoderModel, "text_encoder_3", dtype=self.dtype)]
        tokenizers = [part(AutoTokenizer, sub)
                      for sub in ("tokenizer", "tokenizer_2", "tokenizer_3")]
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = part(AutoencoderKL, "vae", torch_dtype=torch.float32)
        scheduler = part(FlowMatchEulerDiscreteScheduler, "scheduler")

        freeze(transformer, *encoders, vae)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        for clip in encoders[:2]:
            self.quantize_text_encoder(clip, exclude=TE_QUANT_EXCLUDE)
        self.quantize_text_encoder(encoders[2])
        self.place_loaded([transformer], idle=[*encoders, vae])
        self.model, self.vae, self.noise_scheduler = transformer, vae, scheduler
        self.text_encoder, self.text_encoder_2, self.text_encoder_3 = encoders
        self.tokenizer, self.tokenizer_2, self.tokenizer_3 = tokenizers

    @property
    def max_sequence_length(self) -> int:
        """T5 tokens per prompt (`model_kwargs.max_sequence_length`, default 256)."""
        return self.prompt_token_limit(self.tokenizer_3, T5_TOKENS)

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, 16, H/8, W/8), `(z - shift) * scale`; the
        distribution's mean, so cached latents are deterministic."""
        with self.on_device(self.vae):
            return kl_latents.encode(self.vae, images, self.device).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        with self.on_device(self.vae):
            return kl_latents.decode(self.vae, latents, self.device)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: [CLIP-L | CLIP-G penultimate states, zero-padded to T5's width;
        T5 states] (77 + max_sequence_length, D) and the two CLIPs' pooled (1, P1 + P2)."""
        if self.text_encoder is None or self.text_encoder_3 is None:
            raise ModelLoadError("the text encoders are unloaded (text embeddings cached)")
        prompts = list(prompts)
        clip_states, pooled = [], []
        with torch.no_grad():
            for tokenizer, encoder in ((self.tokenizer, self.text_encoder),
                                       (self.tokenizer_2, self.text_encoder_2)):
                ids = tokenizer(prompts, padding="max_length", truncation=True,
                                max_length=tokenizer.model_max_length,
                                return_tensors="pt").input_ids
                with self.on_device(encoder):
                    out = encoder(ids.to(self.device), output_hidden_states=True)
                clip_states.append(out.hidden_states[-2])
                pooled.append(out.text_embeds)
            t5_ids = self.tokenizer_3(prompts, padding="max_length",
                                      max_length=self.max_sequence_length, truncation=True,
                                      add_special_tokens=True, return_tensors="pt").input_ids
            with self.on_device(self.text_encoder_3):
                t5 = self.text_encoder_3(t5_ids.to(self.device))[0]
        clip = torch.cat(clip_states, dim=-1)
        clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        text = torch.cat([clip, t5.to(clip.dtype)], dim=-2).to(self.dtype)
        pooled_all = torch.cat(pooled, dim=-1).to(self.dtype)
        return AdvancedPromptEmbeds(
            text_embeds=[text[i].clone() for i in range(len(prompts))],
            pooled_embeds=[pooled_all[i:i + 1].clone() for i in range(len(prompts))])

    def unload_text_encoder(self) -> None:
        self.text_encoder = self.text_encoder_2 = self.text_encoder_3 = None

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
        from aitk.diffusion.timesteps import FlowShift

        return FlowMatchSchedule(settings,
                                 shift=FlowShift.from_scheduler_config(
                                     self.noise_scheduler.config),
                                 seq_len=image_tokens(2))  # 2x2 latent patches

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b = latent_model_input.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        text, _ = embeds.pad("text_embeds")  # all the same length: no padding happens
        pooled = torch.cat(embeds["pooled_embeds"])
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        return self.model(hidden_states=latent_model_input.to(self.device, self.dtype),
                          timestep=t.to(self.dtype), encoder_hidden_states=text,
                          pooled_projections=pooled, return_dict=False)[0]

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

        pipeline = StableDiffusion3Pipeline(
            transformer=self.model, vae=self.vae,
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config),
            text_encoder=None, tokenizer=self.tokenizer, text_encoder_2=None,
            tokenizer_2=self.tokenizer_2, text_encoder_3=None, tokenizer_3=self.tokenizer_3)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        """True classifier-free guidance with the negative prompt's embeds, as SD3 is
        sampled; the pipeline gets embeds only."""
        self.check_sample_size(gen_config, "SD3: VAE 8 x patch 2")
        cond = conditional_embeds.to(self.device, self.dtype)
        uncond = unconditional_embeds.to(self.device, self.dtype)
        latents = self._start_latents(gen_config, generator)
        out = pipeline(prompt_embeds=cond.text_embeds[0][None],
                       pooled_prompt_embeds=cond.pooled_embeds[0],
                       negative_prompt_embeds=uncond.text_embeds[0][None],
                       negative_pooled_prompt_embeds=uncond.pooled_embeds[0],
                       latents=latents, width=gen_config.width, height=gen_config.height,
                       num_inference_steps=gen_config.sample_steps,
                       guidance_scale=gen_config.guidance_scale, generator=generator,
                       output_type="latent").images
        # Decoded here in float32: the pipeline would hand bf16 latents to the fp32 VAE.
        pixels = self.decode_latents(out)
        return pipeline.image_processor.postprocess(pixels, output_type="pil")[0]

    def _start_latents(self, gen_config: GenerateImageConfig,
                       generator: torch.Generator) -> torch.Tensor:
        """The start noise drawn on the CPU generator, so a preview is the same on every
        device (the pipeline would draw it on the generator's device)."""
        c = self.model.config.in_channels
        f = self.vae_scale_factor
        noise = torch.randn((1, c, gen_config.height // f, gen_config.width // f),
                            generator=generator, dtype=torch.float32)
        return noise.to(self.device, self.dtype)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return {LORA_PREFIX + k: v for k, v in fold_alphas(state_dict).items()}

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        # `transformer.` (this layout) or `diffusion_model.`, same module names.
        return unfolded_alphas(from_public_keys(state_dict))

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * self.model.config.patch_size
