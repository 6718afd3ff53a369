"""FluxModel: FLUX.1 dev and schnell (arch `flux`) on diffusers' Flux classes.

`name_or_path` is a diffusers folder or hub id (`black-forest-labs/FLUX.1-dev`) with
`transformer/ text_encoder/ tokenizer/ text_encoder_2/ tokenizer_2/ vae/ scheduler/`.

- Latents: VAE mean, `(z - shift_factor) * scaling_factor`, (B, 16, H/8, W/8); the
  transformer sees them packed in 2x2 patches with image ids (FluxPipeline's own
  `_pack_latents` / `_prepare_latent_image_ids`), so image sides are multiples of 16.
- Text: CLIP's pooled output and T5's states. Per item `text_embeds` is T5 (L, D) and
  `pooled_embeds` one (1, D) row. Flux has no text mask: T5 states are kept at
  `max_sequence_length` with the encoded pad tokens, exactly what FluxPipeline feeds.
- Timesteps go in as t / 1000; the guidance embedding (dev) gets `train.cfg_scale`
  (1.0 by default) while training, and is skipped with `train.bypass_guidance_embedding`;
  schnell has none and gets no guidance.
- Training schedule: flow matching with the shift read from the model's scheduler
  config (dynamic, 0.5..1.15 over 256..4096 image tokens of 2x2 patches).
- `model.assistant_lora_path` (schnell): a LoRA file (local, or on the hub:
  aitk.models.assistant) merged into the frozen transformer weights before quantization
  and before the trained adapter attaches, so training runs on the de-distilled model;
  it stays merged for previews. The saved LoRA holds only the trained adapter.
- LoRA files: `transformer.` + diffusers module names with `.alpha` (what diffusers'
  `FluxPipeline.load_lora_weights` and ComfyUI read); the older `diffusion_model.`
  layout is read back too.
- `model_kwargs`: `max_sequence_length` (T5 tokens; default the T5 tokenizer's limit,
  at most 512).
- `low_vram`: the text encoders stay on the CPU except while embedding, the VAE except
  while encoding/decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from aitk.adapters.keys import from_public_keys
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import ModelLoadError
from aitk.models import kl_latents
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
         "vae", "scheduler")
LORA_PREFIX = "transformer."
# Kept in float by quantization: the input/time/text embedders and the output layers
# are small and the most sensitive to rounding.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder", "context_embedder", "time_text_embed",
                             "time_text_embed.*", "norm_out", "norm_out.*", "proj_out")
MAX_T5_TOKENS = 512


class FluxModel(BaseModel):
    arch = "flux"
    use_old_lokr_format = False
    lora_block_prefixes = ("transformer_blocks.", "single_transformer_blocks.")
    # The diffusers pipeline of previews and of the tiny model's model_index.json; Kontext
    # runs the same parts through its own.
    pipeline_class: ClassVar[str] = "FluxPipeline"

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.flux.tiny import build_tiny_flux

        build_tiny_flux(target, seed=seed, pipeline_class=cls.pipeline_class)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
        from transformers import AutoTokenizer, CLIPTextModel, CLIPTokenizer, T5EncoderModel

        from aitk.models.loading import check_source, freeze, load_part

        cfg = self.model_config
        name, arch = str(cfg.name_or_path), self.arch
        check_source(name, arch, PARTS)
        assistant = getattr(cfg, "assistant_lora_path", None)
        if assistant:  # merged into the float weights first, quantized after
            transformer = load_part(FluxTransformer2DModel, name, "transformer", arch,
                                    torch_dtype=self.dtype)
        else:
            transformer = self.load_denoiser(FluxTransformer2DModel, name, "transformer",
                                             TRANSFORMER_QUANT_EXCLUDE,
                                             torch_dtype=self.dtype)
        text_encoder = load_part(CLIPTextModel, name, "text_encoder", arch, dtype=self.dtype)
        tokenizer = load_part(CLIPTokenizer, name, "tokenizer", arch)
        text_encoder_2 = self.load_text_encoder(T5EncoderModel, name, "text_encoder_2",
                                                dtype=self.dtype)
        tokenizer_2 = load_part(AutoTokenizer, name, "tokenizer_2", arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKL, name, "vae", arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", arch)

        freeze(transformer, text_encoder, text_encoder_2, vae)
        if assistant:
            from aitk.models.assistant import merge_assistant

            merge_assistant(transformer, str(assistant), "Flux")
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder_2)
        self.place_loaded([transformer], idle=[text_encoder, text_encoder_2, vae])
        self.model, self.vae, self.noise_scheduler = transformer, vae, scheduler
        self.text_encoder, self.tokenizer = text_encoder, tokenizer
        self.text_encoder_2, self.tokenizer_2 = text_encoder_2, tokenizer_2

    @property
    def max_sequence_length(self) -> int:
        """T5 tokens per prompt (`model_kwargs.max_sequence_length`, default T5's limit)."""
        return self.prompt_token_limit(self.tokenizer_2, MAX_T5_TOKENS)

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, C, H/8, W/8), `(z - shift) * scale`.

        The distribution's mean, not a sample: cached latents are then deterministic.
        """
        with self.on_device(self.vae):
            return kl_latents.encode(self.vae, images, self.device).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        with self.on_device(self.vae):
            return kl_latents.decode(self.vae, latents, self.device)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: T5 states (max_sequence_length, D) and CLIP's pooled (1, D)."""
        if self.text_encoder is None or self.text_encoder_2 is None:
            raise ModelLoadError("the text encoders are unloaded (text embeddings cached)")
        prompts = list(prompts)
        clip_ids = self.tokenizer(prompts, padding="max_length",
                                  max_length=self.tokenizer.model_max_length,
                                  truncation=True, return_tensors="pt").input_ids
        t5 = self.tokenizer_2(prompts, padding="max_length",
                              max_length=self.max_sequence_length, truncation=True,
                              return_tensors="pt")
        with torch.no_grad():
            with self.on_device(self.text_encoder):
                pooled = self.text_encoder(clip_ids.to(self.device)).pooler_output
            with self.on_device(self.text_encoder_2):
                states = self.text_encoder_2(t5.input_ids.to(self.device)).last_hidden_state
        if self.attn_masking:  # upstream's model.attn_masking: the padding says nothing
            states = states * t5.attention_mask.to(states.device, states.dtype)[..., None]
        return AdvancedPromptEmbeds(
            text_embeds=[states[i].to(self.dtype).clone() for i in range(len(prompts))],
            pooled_embeds=[pooled[i:i + 1].to(self.dtype).clone()
                           for i in range(len(prompts))])

    @property
    def attn_masking(self) -> bool:
        return bool(getattr(self.model_config, "attn_masking", False))

    @property
    def text_embedding_space_version(self) -> str:
        # the masked states are other embeddings: cached ones of the plain run don't serve
        return "1-attn_masking" if self.attn_masking else "1"

    def unload_text_encoder(self) -> None:
        self.text_encoder = None
        self.text_encoder_2 = None

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
        from aitk.diffusion.timesteps import FlowShift

        return FlowMatchSchedule(settings,
                                 shift=FlowShift.from_scheduler_config(
                                     self.noise_scheduler.config),
                                 seq_len=image_tokens(2))  # 2x2 latent patches

    @property
    def has_guidance_embedding(self) -> bool:
        return bool(getattr(self.model.config, "guidance_embeds", False))

    def training_guidance(self) -> float | None:
        """The guidance fed while training: `train.cfg_scale`, or None (no embedding,
        or `bypass_guidance_embedding`)."""
        tc = self.train_config
        if not self.has_guidance_embedding or getattr(tc, "bypass_guidance_embedding", False):
            return None
        return float(getattr(tc, "cfg_scale", None) or 1.0)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        from diffusers import FluxPipeline

        b, c, h, w = latent_model_input.shape
        packed, img_ids = self.pack_with_ids(latent_model_input)
        out = self.predict_packed(packed, img_ids, timestep, text_embeddings)
        f = self.vae_scale_factor
        return FluxPipeline._unpack_latents(out, h * f, w * f, f)

    def pack_with_ids(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, h, w) -> 2x2-packed tokens (B, h*w/4, 4C) and their (h*w/4, 3) ids, as
        FluxPipeline makes them."""
        from diffusers import FluxPipeline

        b, c, h, w = latents.shape
        if h % 2 or w % 2:
            raise ValueError(f"Flux latents must have even sides (2x2 packing), got {h}x{w}")
        x = latents.to(self.device, self.dtype)
        packed = FluxPipeline._pack_latents(x, b, c, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, self.device,
                                                         self.dtype)
        return packed, img_ids

    def predict_packed(self, packed: torch.Tensor, img_ids: torch.Tensor,
                       timestep: torch.Tensor, text_embeddings: AdvancedPromptEmbeds
                       ) -> torch.Tensor:
        """The transformer on packed image tokens: output tokens, same shape."""
        b = packed.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        text, _ = embeds.pad("text_embeds")
        pooled, _ = embeds.pad("pooled_embeds")
        txt_ids = torch.zeros(text.shape[1], 3, device=self.device, dtype=self.dtype)
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        scale = self.training_guidance()
        guidance = None if scale is None else torch.full((b,), scale, device=self.device,
                                                          dtype=torch.float32)
        if guidance is not None and self.guidance_override is not None:
            # do_guidance_loss: the step's guidance scale, one per item
            guidance = self.guidance_override.to(self.device, torch.float32).expand(b)
        bypass = self.has_guidance_embedding and guidance is None
        with guidance_bypassed(self.model, bypass):
            return self.model(hidden_states=packed, timestep=(t / 1000.0).to(self.dtype),
                              guidance=guidance, pooled_projections=pooled[:, 0],
                              encoder_hidden_states=text, txt_ids=txt_ids, img_ids=img_ids,
                              return_dict=False)[0]

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        import diffusers
        from diffusers import FlowMatchEulerDiscreteScheduler

        pipeline = getattr(diffusers, self.pipeline_class)(
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config),
            vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer,
            text_encoder_2=self.text_encoder_2, tokenizer_2=self.tokenizer_2,
            transformer=self.model)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        """Embedded guidance (`guidance_scale`) as FLUX.1 dev is sampled; no true CFG,
        so the negative prompt is not used."""
        self.check_sample_size(gen_config, "Flux: VAE 8 x packing 2")
        embeds = conditional_embeds.to(self.device, self.dtype)
        text, _ = embeds.pad("text_embeds")
        pooled, _ = embeds.pad("pooled_embeds")
        # FluxPipeline draws its start noise on the generator's device: keep it on the CPU
        # so a preview is the same on every device.
        latents = self._start_latents(gen_config, generator)
        packed = pipeline(prompt_embeds=text, pooled_prompt_embeds=pooled[:, 0],
                          latents=latents, width=gen_config.width, height=gen_config.height,
                          num_inference_steps=gen_config.sample_steps,
                          guidance_scale=gen_config.guidance_scale, generator=generator,
                          output_type="latent").images
        return self.packed_to_image(pipeline, packed, gen_config)

    def packed_to_image(self, pipeline: Any, packed: torch.Tensor,
                        gen_config: GenerateImageConfig) -> Any:
        """The pipeline's final packed latents -> PIL, decoded by `decode_latents` (the
        VAE stays float32 while the transformer may run in bf16, so the pipeline's own
        decode would feed it the wrong dtype), post-processed as the pipeline does."""
        from diffusers import FluxPipeline

        f = self.vae_scale_factor
        latents = FluxPipeline._unpack_latents(packed, gen_config.height, gen_config.width, f)
        pixels = self.decode_latents(latents)
        return pipeline.image_processor.postprocess(pixels, output_type="pil")[0]

    def _start_latents(self, gen_config: GenerateImageConfig,
                       generator: torch.Generator) -> torch.Tensor:
        from diffusers import FluxPipeline

        c = self.model.config.in_channels // 4
        h = 2 * (gen_config.height // (self.vae_scale_factor * 2))
        w = 2 * (gen_config.width // (self.vae_scale_factor * 2))
        noise = torch.randn((1, c, h, w), generator=generator, dtype=torch.float32)
        return FluxPipeline._pack_latents(noise, 1, c, h, w).to(self.device, self.dtype)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return {LORA_PREFIX + k: v for k, v in state_dict.items()}

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        # `transformer.` (this layout) or the older `diffusion_model.`, same module names.
        return from_public_keys(state_dict)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * 2


# ---- guidance bypass ---------------------------------------------------------------------
def _time_text_without_guidance(embed: nn.Module, timestep: torch.Tensor, *args: Any
                                ) -> torch.Tensor:
    """Timestep + pooled-text conditioning with the guidance embedder left out."""
    pooled = args[-1]
    t_emb = embed.timestep_embedder(embed.time_proj(timestep).to(dtype=pooled.dtype))
    return t_emb + embed.text_embedder(pooled)


@contextmanager
def guidance_bypassed(transformer: nn.Module, enabled: bool) -> Iterator[None]:
    """`train.bypass_guidance_embedding`: skip the guidance embedder for this call (the
    transformer then gets no guidance value), as upstream does for de-distilled training."""
    if not enabled:
        yield
        return
    embed = transformer.time_text_embed
    embed.forward = lambda timestep, *args: _time_text_without_guidance(embed, timestep, *args)
    try:
        yield
    finally:
        del embed.forward
