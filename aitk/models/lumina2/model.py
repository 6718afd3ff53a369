"""Lumina2Model: Lumina-Image 2.0 (arch `lumina2`, upstream `is_lumina2: true`) on
diffusers' Lumina 2 classes.

`name_or_path` is a diffusers folder or hub id (`Alpha-VLLM/Lumina-Image-2.0`) with
`transformer/ text_encoder/ tokenizer/ vae/ scheduler/`.

- Latents: VAE mean, `(z - shift_factor) * scaling_factor` (FLUX.1's VAE), (B, 16, H/8,
  W/8); the transformer patchifies 2x2 itself, so image sides are multiples of 16.
- Text, as Lumina2Pipeline encodes it: `system_prompt + " <Prompt Start> " + prompt`
  through Gemma 2, its penultimate hidden states over `max_sequence_length` (256)
  tokens; per item only the tokens the tokenizer's mask keeps (L, 2304). At the model
  call they are padded on the right and masked, as the transformer expects.
- Time: Lumina's own t runs from 0 (noise) to 1 (clean) and its output points from the
  noise to the image; the API's t on 0..1000 (1000 = noise) and velocity `noise - clean`
  are converted here: t_model = 1 - t / 1000, prediction = -output (upstream and the
  pipeline do the same).
- Training schedule: flow matching with the shift of the model's scheduler config for
  `timestep_type: shift` / `lumina2_shift` (upstream's name for the same thing).
- LoRA files: `diffusion_model.` + the authors' names, q/k/v fused, scale folded
  (aitk.models.lumina2.lora_keys), which diffusers' `Lumina2Pipeline.load_lora_weights`
  and ComfyUI read.
- `low_vram`: Gemma stays on the CPU except while embedding, the VAE except while
  encoding/decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import ModelLoadError
from aitk.models import kl_latents
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "text_encoder", "tokenizer", "vae", "scheduler")
MESSAGE_NAME = "Lumina 2"
# Kept in float by quantization: the patch/time/caption embedders and the output layer.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder", "time_caption_embed", "time_caption_embed.*",
                             "norm_out", "norm_out.*")
GEMMA_TOKENS = 256  # Lumina2Pipeline's max_sequence_length default, upstream's too
# Lumina2Pipeline's own system prompt (diffusers' `pipeline.system_prompt`).
SYSTEM_PROMPT = ("You are an assistant designed to generate superior images with the "
                 "superior degree of image-text alignment based on textual prompts or "
                 "user prompts.")


class Lumina2Model(BaseModel):
    arch = "lumina2"
    use_old_lokr_format = False
    lora_block_prefixes = ("layers.", "noise_refiner.", "context_refiner.")

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.lumina2.tiny import build_tiny_lumina2

        build_tiny_lumina2(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKL,
            FlowMatchEulerDiscreteScheduler,
            Lumina2Transformer2DModel,
        )
        from transformers import AutoModel, AutoTokenizer

        from aitk.models.loading import check_source, freeze, load_part

        name = str(self.model_config.name_or_path)
        check_source(name, MESSAGE_NAME, PARTS)

        def part(cls: Any, sub: str, **kw: Any) -> Any:
            return load_part(cls, name, sub, MESSAGE_NAME, **kw)

        transformer = part(Lumina2Transformer2DModel, "transformer", torch_dtype=self.dtype)
        text_encoder = part(AutoModel, "text_encoder", dtype=self.dtype)
        tokenizer = part(AutoTokenizer, "tokenizer")
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = part(AutoencoderKL, "vae", torch_dtype=torch.float32)
        scheduler = part(FlowMatchEulerDiscreteScheduler, "scheduler")

        freeze(transformer, text_encoder, vae)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder, exclude=("*embed_tokens*",))
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.vae, self.noise_scheduler = transformer, vae, scheduler
        self.text_encoder, self.tokenizer = text_encoder, tokenizer

    @property
    def max_sequence_length(self) -> int:
        """Gemma tokens per prompt (`model_kwargs.max_sequence_length`, default 256)."""
        return self.prompt_token_limit(self.tokenizer, GEMMA_TOKENS)

    @property
    def system_prompt(self) -> str:
        return self.model_kwargs.system_prompt or SYSTEM_PROMPT

    @property
    def qkv_rows(self) -> tuple[int, int, int]:
        """Output rows of q, k, v in a block (Lumina 2: 2304, 768, 768: grouped heads)."""
        attn = self.get_model_to_train().layers[0].attn
        return attn.to_q.out_features, attn.to_k.out_features, attn.to_v.out_features

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, C, H/8, W/8), `(z - shift) * scale`; the
        distribution's mean, so cached latents are deterministic."""
        with self.on_device(self.vae):
            return kl_latents.encode(self.vae, images, self.device).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        with self.on_device(self.vae):
            return kl_latents.decode(self.vae, latents, self.device)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: Gemma's penultimate states of the templated prompt, the tokens the
        mask keeps (L, D)."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        texts = [f"{self.system_prompt} <Prompt Start> {p}" for p in prompts]
        tokens = self.tokenizer(texts, padding="max_length", truncation=True,
                                max_length=self.max_sequence_length, return_tensors="pt")
        mask = tokens.attention_mask.bool()
        with torch.no_grad(), self.on_device(self.text_encoder):
            out = self.text_encoder(tokens.input_ids.to(self.device),
                                    attention_mask=tokens.attention_mask.to(self.device),
                                    output_hidden_states=True)
        states = out.hidden_states[-2].to(self.dtype)
        return AdvancedPromptEmbeds(
            text_embeds=[states[i][mask[i].to(states.device)].clone()
                         for i in range(len(prompts))])

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
        text, mask = embeds.pad("text_embeds")
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        out = self.model(hidden_states=latent_model_input.to(self.device, self.dtype),
                         timestep=(1.0 - t / 1000.0).to(self.dtype),
                         encoder_hidden_states=text, encoder_attention_mask=mask,
                         return_dict=False)[0]
        return -out

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline

        pipeline = Lumina2Pipeline(
            transformer=self.model, vae=self.vae, text_encoder=None, tokenizer=self.tokenizer,
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config))
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        """True CFG against the negative prompt (with the pipeline's CFG normalisation),
        embeds only: both padded to one length, as the pipeline requires."""
        self.check_sample_size(gen_config, "Lumina 2: VAE 8 x patch 2")
        kwargs = pipeline_embeds(conditional_embeds, unconditional_embeds, self.device,
                                 self.dtype)
        latents = self._start_latents(gen_config, generator)
        out = pipeline(**kwargs, latents=latents, width=gen_config.width,
                       height=gen_config.height, num_inference_steps=gen_config.sample_steps,
                       guidance_scale=gen_config.guidance_scale, generator=generator,
                       output_type="latent").images
        # Decoded here in float32: the pipeline would hand bf16 latents to the fp32 VAE.
        pixels = self.decode_latents(out)
        return pipeline.image_processor.postprocess(pixels, output_type="pil")[0]

    def _start_latents(self, gen_config: GenerateImageConfig,
                       generator: torch.Generator) -> torch.Tensor:
        """The start noise drawn on the CPU generator, the same on every device."""
        c = self.model.config.in_channels
        f = self.vae_scale_factor
        noise = torch.randn((1, c, gen_config.height // f, gen_config.width // f),
                            generator=generator, dtype=torch.float32)
        return noise.to(self.device, self.dtype)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        from aitk.models.lumina2.lora_keys import to_file

        return to_file(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        from aitk.models.lumina2.lora_keys import from_file

        return from_file(state_dict, self.qkv_rows)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * self.model.config.patch_size


def pipeline_embeds(cond: AdvancedPromptEmbeds, uncond: AdvancedPromptEmbeds,
                    device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One prompt and its negative as Lumina2Pipeline takes them: (1, L, D) each with
    its (1, L) mask, padded on the right to one length L."""
    both = AdvancedPromptEmbeds(text_embeds=[cond.text_embeds[0], uncond.text_embeds[0]])
    text, mask = both.to(device, dtype).pad("text_embeds")
    mask = mask.long()
    return {"prompt_embeds": text[:1], "prompt_attention_mask": mask[:1],
            "negative_prompt_embeds": text[1:], "negative_prompt_attention_mask": mask[1:]}
