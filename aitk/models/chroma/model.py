"""ChromaModel: Chroma (arch `chroma`), Flux's architecture pruned and guidance-distilled,
on diffusers' ChromaTransformer2DModel / ChromaPipeline.

`name_or_path` is a diffusers folder or hub id (`lodestones/Chroma1-HD`) with
`transformer/ text_encoder/ tokenizer/ vae/ scheduler/`.

- Latents, packing and the training schedule are Flux's (aitk.models.flux.model):
  `(z - shift) * scale`, 2x2 patches with FluxPipeline's ids, flow matching with the
  shift read from the scheduler config; image sides are multiples of 16.
- Text: T5 only (no CLIP, no pooled vector). T5 runs with the tokenizer's mask, and, as
  ChromaPipeline does, the transformer sees the prompt's tokens plus exactly ONE pad
  token; every later pad is masked out. Per item `text_embeds` keeps just those tokens
  (L = prompt + EOS + 1 pad, or `max_sequence_length` when the prompt fills it); a batch
  is padded at the model call and the padding masked with a boolean mask.
- No guidance embedding: the timestep (t / 1000) drives the distilled-guidance
  approximator that makes every block's modulation; `train.cfg_scale` is not used.
  Previews use true CFG with the negative prompt (`guidance_scale` > 1).
- Gradient checkpointing: diffusers' Chroma calls its single-stream blocks without the
  attention mask when checkpointing; `get_noise_prediction` hands the mask to those
  calls, so gradients are the same with and without checkpointing.
- LoRA files: `transformer.` + diffusers module names with `.alpha`, as Flux: what
  `ChromaPipeline.load_lora_weights` reads and what ComfyUI maps for Chroma (its Chroma
  model is a Flux model, so Flux's diffusers-name table applies); the older
  `diffusion_model.` layout is read back too.
- `model_kwargs`: `max_sequence_length` (T5 tokens; default the tokenizer's limit, at
  most 512). `low_vram`: T5 and the VAE stay on the CPU when idle.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aitk.errors import ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.flux.model import MAX_T5_TOKENS, FluxModel
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "text_encoder", "tokenizer", "vae", "scheduler")
# Kept in float by quantization: the input embedders, the guidance approximator (it
# makes every block's modulation) and the output layers.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder", "context_embedder", "distilled_guidance_layer",
                             "distilled_guidance_layer.*", "norm_out", "norm_out.*",
                             "proj_out")


def kept_token_mask(tokenizer_mask: torch.Tensor) -> torch.Tensor:
    """ChromaPipeline's text mask: the prompt's tokens and the first pad token after them
    (position <= number of real tokens), as booleans."""
    lengths = tokenizer_mask.sum(dim=1, keepdim=True)
    positions = torch.arange(tokenizer_mask.shape[1], device=tokenizer_mask.device)
    return positions[None, :] <= lengths


class ChromaModel(FluxModel):
    arch = "chroma"
    use_old_lokr_format = False
    lora_block_prefixes = ("transformer_blocks.", "single_transformer_blocks.")
    pipeline_class = "ChromaPipeline"  # its parts differ from Flux's: see below

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.chroma.tiny import build_tiny_chroma

        build_tiny_chroma(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKL,
            ChromaTransformer2DModel,
            FlowMatchEulerDiscreteScheduler,
        )
        from transformers import AutoTokenizer, T5EncoderModel

        from aitk.models.loading import check_source, freeze, load_part

        cfg = self.model_config
        name, arch = str(cfg.name_or_path), self.arch
        # Upstream configs may name one transformer file (parts from FLUX.1-schnell).
        check_source(name, arch, PARTS, single_file_hint="e.g. lodestones/Chroma1-HD")
        transformer = self.load_denoiser(ChromaTransformer2DModel, name, "transformer",
                                         TRANSFORMER_QUANT_EXCLUDE, torch_dtype=self.dtype)
        text_encoder = self.load_text_encoder(T5EncoderModel, name, "text_encoder",
                                              dtype=self.dtype)
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKL, name, "vae", arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", arch)

        freeze(transformer, text_encoder, vae)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.vae, self.noise_scheduler = transformer, vae, scheduler
        self.text_encoder, self.tokenizer = text_encoder, tokenizer

    @property
    def max_sequence_length(self) -> int:
        return self.prompt_token_limit(self.tokenizer, MAX_T5_TOKENS)  # T5 is the only one

    # ---- 2. encoders ---------------------------------------------------------------
    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: T5 states of the prompt's tokens plus one pad token, (L, D)."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        tokens = self.tokenizer(list(prompts), padding="max_length",
                                max_length=self.max_sequence_length, truncation=True,
                                return_tensors="pt")
        mask = tokens.attention_mask
        with torch.no_grad(), self.on_device(self.text_encoder):
            states = self.text_encoder(tokens.input_ids.to(self.device),
                                       attention_mask=mask.to(self.device)).last_hidden_state
        keep = kept_token_mask(mask).to(states.device)
        return AdvancedPromptEmbeds(
            text_embeds=[states[i][keep[i]].to(self.dtype).clone() for i in range(len(mask))])

    def unload_text_encoder(self) -> None:
        self.text_encoder = None

    # ---- 3. train step -------------------------------------------------------------
    @property
    def has_guidance_embedding(self) -> bool:
        return False

    def training_guidance(self) -> float | None:
        return None

    def predict_packed(self, packed: torch.Tensor, img_ids: torch.Tensor,
                       timestep: torch.Tensor, text_embeddings: AdvancedPromptEmbeds
                       ) -> torch.Tensor:
        b = packed.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        text, text_mask = embeds.pad("text_embeds")
        mask = torch.cat([text_mask.to(self.device),
                          torch.ones(b, packed.shape[1], dtype=torch.bool,
                                     device=self.device)], dim=1)
        txt_ids = torch.zeros(text.shape[1], 3, device=self.device, dtype=self.dtype)
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        with single_blocks_keep_mask(self.model, mask):
            return self.model(hidden_states=packed, encoder_hidden_states=text,
                              timestep=(t / 1000.0).to(self.dtype), txt_ids=txt_ids,
                              img_ids=img_ids, attention_mask=mask, return_dict=False)[0]

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import ChromaPipeline, FlowMatchEulerDiscreteScheduler

        pipeline = ChromaPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config),
            vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer,
            transformer=self.model)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        """True CFG (`guidance_scale` > 1) with the negative prompt, as ChromaPipeline."""
        self.check_sample_size(gen_config, "Chroma: VAE 8 x packing 2")
        cond, cond_mask = chroma_pipeline_embeds(conditional_embeds, self.device, self.dtype)
        neg, neg_mask = chroma_pipeline_embeds(unconditional_embeds, self.device, self.dtype)
        latents = self._start_latents(gen_config, generator)
        packed = pipeline(prompt_embeds=cond, prompt_attention_mask=cond_mask,
                          negative_prompt_embeds=neg, negative_prompt_attention_mask=neg_mask,
                          latents=latents, width=gen_config.width, height=gen_config.height,
                          num_inference_steps=gen_config.sample_steps,
                          guidance_scale=gen_config.guidance_scale, generator=generator,
                          output_type="latent").images
        return self.packed_to_image(pipeline, packed, gen_config)


def chroma_pipeline_embeds(embeds: AdvancedPromptEmbeds, device: torch.device,
                           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """What ChromaPipeline takes for `prompt_embeds` and `prompt_attention_mask`: the kept
    tokens and a boolean mask (all True: the later pads are already dropped)."""
    text, mask = embeds.to(device, dtype).pad("text_embeds")
    return text, mask.to(device)


@contextmanager
def single_blocks_keep_mask(transformer: nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """diffusers' ChromaTransformer2DModel calls its single-stream blocks through the
    checkpointing function without `attention_mask`; while this call runs, give it to
    them. The partial is what checkpointing stores, so the recompute sees it too."""
    from diffusers.models.transformers.transformer_chroma import ChromaSingleTransformerBlock

    original = getattr(transformer, "_gradient_checkpointing_func", None)
    if original is None or not getattr(transformer, "gradient_checkpointing", False):
        yield
        return

    def checkpointed(block: Any, *args: Any) -> Any:
        if isinstance(block, ChromaSingleTransformerBlock) and len(args) == 3:
            block = functools.partial(block, attention_mask=mask)
        return original(block, *args)

    transformer._gradient_checkpointing_func = checkpointed
    try:
        yield
    finally:
        transformer._gradient_checkpointing_func = original
