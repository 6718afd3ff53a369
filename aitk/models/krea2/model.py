"""Krea2Model: the `krea2` arch (Krea 2 Raw, and Turbo with its training adapter) on
diffusers' Krea2Pipeline parts.

`name_or_path`: a diffusers folder or hub id with

    model_index.json  Krea2Pipeline's: the tapped text layers, `is_distilled` (Turbo)
    transformer/      Krea2Transformer2DModel (single-stream MMDiT over 2x2 patches,
                      its own text-fusion stage over the tapped layers)
    text_encoder/     Qwen3VLModel (Qwen3-VL-4B; its vision tower is dropped)
    tokenizer/        Qwen2Tokenizer
    vae/              AutoencoderKLQwenImage (a video VAE: images get a 1-frame axis)
    scheduler/        FlowMatchEulerDiscreteScheduler (dynamic exponential shift, mu over
                      256..6400 image tokens)

Conventions at this arch's edges:
- Latents: the VAE mean normalised per channel with `latents_mean` / `latents_std`,
  (B, 16, H/8, W/8); packed 2x2 into (B, h/2 * w/2, 64) for the transformer, so image
  sides are multiples of 16.
- Prompts: Qwen-Image's chat template with the pipeline's layout (system prefix, prompt,
  assistant suffix; positions count real tokens only). The hidden states of the tapped
  layers (`text_encoder_select_layers`, 12 of Qwen3-VL-4B's) are stacked per token and
  the first 34 tokens (the system prefix) dropped, as Krea2Pipeline does; each prompt is
  kept at its own length as one (L_i, layers x D) tensor and padded with a mask per batch.
- Time: aitk's (t = 1 noise, target noise - clean); the transformer takes t / 1000.
- Training: flow matching with the scheduler's dynamic shift for `shift` timesteps.
- `model.assistant_lora_path` (Turbo): the de-distillation adapter (Krea's module names,
  as upstream's) is merged into the frozen transformer before quantization and taken out
  again for previews, as upstream samples Turbo.
- Previews: Krea2Pipeline with embeds only; `guidance_scale` g > 1 runs CFG at the
  pipeline's zero-based scale g - 1 (cond + s (cond - uncond)), as upstream.
- LoRA files: `diffusion_model.` + Krea's module names, alpha folded into the up weights
  (aitk.models.krea2.lora_keys); LoRA goes on the 28 transformer blocks.
- `low_vram`: the text encoder and VAE wait on the CPU and visit the device to work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.diffusion.timesteps import FlowShift
from aitk.errors import ModelLoadError
from aitk.models.assistant import LoraDelta, merge_assistant, removed
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.krea2 import lora_keys
from aitk.models.loading import HUB_FIX, check_source, freeze, load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.qwen_image import latents as latent_space
from aitk.models.qwen_image.model import PROMPT_TEMPLATE

PARTS = ("transformer", "text_encoder", "tokenizer", "vae", "scheduler")
PATCH = 2
MAX_PROMPT_TOKENS = 512  # after the system prefix, suffix included (the pipeline's)
# Krea2Pipeline's template layout: the system prefix's tokens (dropped from the states)
# and the assistant suffix's (appended after the prompt).
PREFIX_TOKENS = 34
SUFFIX_TOKENS = 5
PROMPT_PREFIX, PROMPT_SUFFIX = PROMPT_TEMPLATE.split("{}")
# Krea 2's 12 taps of Qwen3-VL-4B's hidden states (Krea2Pipeline's default).
SELECT_LAYERS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
# Kept in the float dtype by quantization (upstream's list, in diffusers' names): the
# latent and text input projections, the time embedding and its modulation projection,
# the text fusion's layer mixer and the output layer.
TRANSFORMER_QUANT_EXCLUDE = ("img_in", "time_embed*", "time_mod_proj", "txt_in*",
                             "text_fusion.projector", "final_layer*")


class Krea2Model(BaseModel):
    arch = "krea2"
    use_old_lokr_format = False
    lora_block_prefixes = ("transformer_blocks.",)

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.krea2.tiny import build_tiny_krea2

        build_tiny_krea2(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKLQwenImage,
            FlowMatchEulerDiscreteScheduler,
            Krea2Transformer2DModel,
        )
        from transformers import AutoTokenizer, Qwen3VLModel

        name, arch = str(self.model_config.name_or_path), self.arch
        check_source(name, arch, PARTS)
        pipeline_config = read_pipeline_config(name, arch)
        transformer = load_part(Krea2Transformer2DModel, name, "transformer", arch,
                                torch_dtype=self.dtype)
        text_encoder = load_part(Qwen3VLModel, name, "text_encoder", arch, dtype=self.dtype)
        # Text to image never shows the encoder an image: its vision tower goes.
        text_encoder.visual = None
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKLQwenImage, name, "vae", arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", arch)
        freeze(transformer, text_encoder, vae)
        self.select_layers = tuple(pipeline_config.get("text_encoder_select_layers")
                                   or SELECT_LAYERS)
        self.is_distilled = bool(pipeline_config.get("is_distilled", False))
        self.assistant: dict[str, LoraDelta] = {}
        spec = getattr(self.model_config, "assistant_lora_path", None)
        if spec:
            self.assistant = merge_assistant(transformer, str(spec), "Krea 2",
                                             to_internal=lora_keys.from_file)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.vae, self.noise_scheduler = vae, scheduler

    # ---- 2. encoders ---------------------------------------------------------------
    # Qwen-Image's VAE and its per-channel normalisation (aitk/models/qwen_image/latents.py).
    @property
    def vae_scale_factor(self) -> int:
        return latent_space.vae_scale_factor(self.vae)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return latent_space.encode_images(self, images)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return latent_space.decode_latents(self, latents)

    @property
    def max_text_length(self) -> int:
        tokens = getattr(self.model_kwargs, "max_text_length", None)
        return int(tokens) if tokens is not None else MAX_PROMPT_TOKENS

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, layers x D) tensor per prompt: the tapped hidden states of its real
        tokens after the system prefix (what Krea2Pipeline.get_text_hidden_states gives
        for them), flattened so prompts of any length batch with a mask."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        tok = self.tokenizer
        # The pipeline's layout, padded to the longest prompt rather than to a fixed
        # length: [prefix | prompt | pad | suffix], positions counting real tokens, so
        # each real token's states are the pipeline's.
        text = tok([PROMPT_PREFIX + p for p in prompts], padding="longest", truncation=True,
                   max_length=self.max_text_length + PREFIX_TOKENS - SUFFIX_TOKENS,
                   return_tensors="pt")
        suffix = tok([PROMPT_SUFFIX] * len(prompts), return_tensors="pt")
        ids = torch.cat([text.input_ids, suffix.input_ids], dim=1)
        mask = torch.cat([text.attention_mask, suffix.attention_mask], dim=1).bool()
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            out = te(input_ids=ids.to(where), attention_mask=mask.to(where),
                     position_ids=positions.to(where), output_hidden_states=True)
            states = torch.stack([out.hidden_states[i] for i in self.select_layers], dim=2)
        states, mask = states[:, PREFIX_TOKENS:], mask[:, PREFIX_TOKENS:].to(states.device)
        return AdvancedPromptEmbeds(text_embeds=[
            states[i][mask[i]].flatten(1).to(self.device, self.dtype).clone()
            for i in range(len(prompts))])

    @property
    def text_embedding_space_version(self) -> str:
        layers = "-".join(str(i) for i in self.select_layers)
        return f"krea2-1-{self.max_text_length}-{layers}"

    @property
    def latent_space_version(self) -> str:
        return "qwen_image-1"  # the same VAE and normalisation

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        return FlowMatchSchedule(settings, FlowShift.from_scheduler_config(
            self.noise_scheduler.config), image_tokens(PATCH))

    pack = staticmethod(latent_space.pack)  # Krea2Pipeline._pack_latents' order
    unpack = staticmethod(latent_space.unpack)

    def transformer_inputs(self, embeds: AdvancedPromptEmbeds, batch: int, h: int, w: int
                           ) -> dict[str, torch.Tensor]:
        """The text stack (B, L, layers, D), its mask and the position ids of a batch of
        (h, w) latents, as the transformer takes them."""
        from diffusers import Krea2Pipeline

        context, mask = embeds.expand_to_batch(batch).to(self.device, self.dtype).pad(
            "text_embeds")
        cfg = self.model.config
        context = context.view(batch, context.shape[1], cfg.num_text_layers,
                               cfg.text_hidden_dim)
        ids = Krea2Pipeline.prepare_position_ids(context.shape[1], h // PATCH, w // PATCH,
                                                 self.device)
        return {"encoder_hidden_states": context, "encoder_attention_mask": mask,
                "position_ids": ids}

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b, _, h, w = latent_model_input.shape
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        out = self.model(hidden_states=self.pack(latent_model_input.to(self.device,
                                                                       self.dtype)),
                         timestep=(t / 1000.0).to(self.dtype), return_dict=False,
                         **self.transformer_inputs(text_embeddings, b, h, w))[0]
        return self.unpack(out, h, w)

    # ---- 4. previews ---------------------------------------------------------------
    def generate_images(self, configs: Sequence[GenerateImageConfig],
                        prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None
                        ) -> list[Image.Image]:
        """As BaseModel's, with the training adapter (if any) taken out."""
        with removed(self.model, getattr(self, "assistant", {})):
            return super().generate_images(configs, prompt_embeds)

    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, Krea2Pipeline

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = Krea2Pipeline(scheduler=scheduler, vae=self.vae, text_encoder=None,
                                 tokenizer=None, transformer=self.model,
                                 text_encoder_select_layers=self.select_layers,
                                 is_distilled=self.is_distilled, patch_size=PATCH)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        self.check_sample_size(gen_config, "Krea 2: VAE 8 x patch 2")
        with self.on_device(self.vae):
            return run_pipeline(pipeline, gen_config, conditional_embeds,
                                unconditional_embeds, generator, self.device, self.dtype)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return lora_keys.to_file(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return lora_keys.from_file(state_dict)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * PATCH


def read_pipeline_config(name_or_path: str, arch: str) -> dict[str, Any]:
    """model_index.json of the folder or hub repo: the pipeline's own settings (the
    tapped layers, `is_distilled`); one ModelLoadError line when it cannot be read."""
    root = Path(name_or_path).expanduser()
    try:
        if root.is_dir():
            return json.loads((root / "model_index.json").read_text(encoding="utf-8"))
        from diffusers import Krea2Pipeline

        return dict(Krea2Pipeline.load_config(name_or_path))
    except (OSError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        fix = "check the folder" if root.is_dir() else HUB_FIX
        raise ModelLoadError(f"cannot read the {arch} pipeline config (model_index.json) of "
                             f"{name_or_path}: {detail}; {fix}") from None


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype
                 ) -> Image.Image:
    """One image from diffusers' Krea2Pipeline, called with embeds only. Shared by the
    trainer's previews and the interop tests (the same call on a pipeline that loaded
    the LoRA file through diffusers). The start noise is drawn on the CPU, so a preview
    is the same on every device."""
    scale = max(0.0, gen_config.guidance_scale - 1.0)  # the pipeline's CFG is zero-based
    cfg = pipeline.transformer.config
    f = pipeline.vae_scale_factor

    # The pipeline gives both CFG passes one set of position ids: the negative prompt's
    # stack is padded (masked) to the prompt's length, or both to the longer one.
    length = max(t.shape[0] for e in ((conditional, unconditional) if scale > 0
                                      else (conditional,)) for t in e.text_embeds)

    def stack(embeds: AdvancedPromptEmbeds) -> tuple[torch.Tensor, torch.Tensor]:
        context, mask = embeds.to(device, dtype).pad("text_embeds", max_length=length)
        return context.view(*context.shape[:2], cfg.num_text_layers,
                            cfg.text_hidden_dim), mask

    channels = cfg.in_channels // PATCH**2
    noise = torch.randn((1, channels, gen_config.height // f, gen_config.width // f),
                        generator=generator, dtype=torch.float32)
    cond, cond_mask = stack(conditional)
    kwargs: dict[str, Any] = {}
    if scale > 0:
        neg, neg_mask = stack(unconditional)
        kwargs.update(negative_prompt_embeds=neg, negative_prompt_embeds_mask=neg_mask)
    return pipeline(prompt_embeds=cond, prompt_embeds_mask=cond_mask, guidance_scale=scale,
                    width=gen_config.width, height=gen_config.height,
                    num_inference_steps=gen_config.sample_steps,
                    latents=latent_space.pack(noise).to(device, dtype),
                    generator=generator, output_type="pil", **kwargs).images[0]
