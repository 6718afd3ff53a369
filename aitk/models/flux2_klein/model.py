"""FLUX.2 [klein] (archs `flux2_klein_4b`, `flux2_klein_9b`, alias `flux2_klein`) on
diffusers' Flux2KleinPipeline parts.

`name_or_path`: a diffusers folder or hub id (black-forest-labs/FLUX.2-klein-base-4B,
...-base-9B, or the step-distilled FLUX.2-klein-4B / -9B) with

    transformer/   Flux2Transformer2DModel (double + single stream blocks, 4-axis RoPE)
    vae/           AutoencoderKLFlux2 (32 latent channels, BatchNorm statistics)
    text_encoder/  Qwen3 (Qwen3-4B for 4B, Qwen3-8B for 9B; loaded without its LM head)
    tokenizer/     Qwen2Tokenizer with Qwen3's chat template
    scheduler/     FlowMatchEulerDiscreteScheduler
    model_index.json   `is_distilled` (step-distilled: no true CFG)

The 4B and 9B archs differ only in the weights the folder holds, so both are this class.

Conventions at this arch's edges:
- Latents are (B, 4 x 32, H/16, W/16): the VAE mean patchified 2x2 and normalised with
  the VAE's BatchNorm running mean and std (sqrt(var + eps)), as the pipeline does; the
  transformer sees one token per latent pixel, so image sides are multiples of 16.
- Prompts: Qwen3's chat template (user turn, generation prompt, thinking disabled),
  padded to `max_sequence_length` (512, or the tokenizer's limit if lower) with the
  pipeline's padding; the hidden states after layers (9, 18, 27) are stacked per token
  into one (L, 3 x D) row. No text mask: the transformer attends to the pad tokens, as
  the pipeline feeds them.
- Position ids (t, h, w, l): image tokens (0, row, col, 0), text tokens (0, 0, 0, i).
- Timesteps go in as t / 1000; klein has no guidance embedding (guidance=None).
- Training: flow matching; `shift` / `flux_shift` timestep types use the pipeline's own
  shift, mu = the empirical mu of the image token count at `shift_steps` sampling steps
  (default 50, or 4 for a step-distilled model), exponential as the scheduler config says.
- Previews: Flux2KleinPipeline with embeds; a base model runs true CFG against the
  negative prompt when guidance_scale > 1, a distilled one never does.
- LoRA files: kohya names over BFL modules with alpha (see lora_keys.py), read by
  ComfyUI and diffusers' `Flux2KleinPipeline.load_lora_weights`.
- `model_kwargs`: `max_sequence_length`, `text_encoder_out_layers` (default [9, 18, 27]),
  `shift_steps`, `is_distilled` (overrides model_index.json).
- `low_vram`: the text encoder and VAE idle on the CPU and visit the device to work.
- Qwen3's decoder layers after the deepest one read (27, of 36) are dropped at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import ModelLoadError
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.flux2_klein import lora_keys
from aitk.models.flux2_klein.schedule import EmpiricalShift
from aitk.models.loading import freeze, load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

MAX_PROMPT_TOKENS = 512
TEXT_LAYERS = (9, 18, 27)
# Kept in the float dtype by quantization: the input/time embedders and the output layers.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder", "context_embedder", "time_guidance_embed*",
                             "norm_out*", "proj_out")


class Flux2KleinModel(BaseModel):
    arch = "flux2_klein"
    use_old_lokr_format = False
    lora_block_prefixes = ("transformer_blocks.", "single_transformer_blocks.")
    supports_dora = False  # its files fuse q/k/v (lora_keys): no per-layer magnitude

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.flux2_klein.tiny import build_tiny_flux2_klein

        build_tiny_flux2_klein(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKLFlux2,
            FlowMatchEulerDiscreteScheduler,
            Flux2Transformer2DModel,
        )
        from transformers import AutoTokenizer, Qwen3Model

        cfg = self.model_config
        name = str(cfg.name_or_path)
        transformer = self.load_denoiser(Flux2Transformer2DModel, name, "transformer",
                                         TRANSFORMER_QUANT_EXCLUDE, torch_dtype=self.dtype)
        # Only hidden states are used: the LM head (1.2 GB for Qwen3-8B) stays on disk.
        text_encoder = self.load_text_encoder(Qwen3Model, name, "text_encoder",
                                              dtype=self.dtype)
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", self.arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKLFlux2, name, "vae", self.arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", self.arch)
        self.is_distilled = self._read_is_distilled(name)
        if min(self.text_layers) >= 0:  # a negative index counts from the last layer
            keep_text_layers(text_encoder, max(self.text_layers) + 1)
        freeze(transformer, text_encoder, vae)
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.vae, self.noise_scheduler = vae, scheduler
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)

    def _read_is_distilled(self, name: str) -> bool:
        """`model_kwargs.is_distilled`, else model_index.json's (False when absent)."""
        if self.model_kwargs.is_distilled is not None:
            return self.model_kwargs.is_distilled
        local = Path(name).expanduser()
        try:
            if local.is_dir():
                index = local / "model_index.json"
                if not index.is_file():
                    return False
            else:
                from huggingface_hub import hf_hub_download
                from huggingface_hub.errors import RemoteEntryNotFoundError

                try:
                    index = Path(hf_hub_download(name, "model_index.json"))
                except RemoteEntryNotFoundError:  # a repo of parts only: not distilled
                    return False
            return bool(json.loads(index.read_text()).get("is_distilled", False))
        except (OSError, ValueError) as exc:
            detail = " ".join(str(exc).split())[:200]
            raise ModelLoadError(f"cannot read the {self.arch} model_index.json of {name!r}: "
                                 f"{detail}; set model_kwargs.is_distilled to skip it"
                                 ) from None

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def _bn_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE BatchNorm's running mean and std over the patchified channels."""
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, torch.float32)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1).float()
                         + self.vae.config.batch_norm_eps).to(like.device)
        return mean, std

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, 4C, H/16, W/16): the distribution's mean,
        patchified 2x2, normalised with the BatchNorm statistics."""
        from diffusers import Flux2KleinPipeline

        with torch.no_grad(), self.on_device(self.vae):
            z = self.vae.encode(images.to(self.device, torch.float32)).latent_dist.mode()
        z = Flux2KleinPipeline._patchify_latents(z)
        mean, std = self._bn_stats(z)
        return ((z - mean) / std).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        from diffusers import Flux2KleinPipeline

        z = latents.to(self.device, torch.float32)
        mean, std = self._bn_stats(z)
        z = Flux2KleinPipeline._unpatchify_latents(z * std + mean)
        with torch.no_grad(), self.on_device(self.vae):
            return self.vae.decode(z).sample

    @property
    def max_sequence_length(self) -> int:
        return self.prompt_token_limit(self.tokenizer, MAX_PROMPT_TOKENS)

    @property
    def text_layers(self) -> tuple[int, ...]:
        return tuple(self.model_kwargs.text_encoder_out_layers or TEXT_LAYERS)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (max_sequence_length, 3 x D) tensor per prompt: the stacked hidden states
        of the chat-templated prompt, pad tokens included (what the pipeline feeds)."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        texts = [self.tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True,
            enable_thinking=False) for p in prompts]
        tokens = self.tokenizer(texts, padding="max_length", truncation=True,
                                max_length=self.max_sequence_length, return_tensors="pt")
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            hidden = te(input_ids=tokens.input_ids.to(where),
                        attention_mask=tokens.attention_mask.to(where),
                        output_hidden_states=True, use_cache=False).hidden_states
        layers = self.text_layers
        if max(layers) >= len(hidden):
            raise ModelLoadError(f"text_encoder_out_layers {list(layers)} needs a text "
                                 f"encoder with {max(layers)} layers; it has {len(hidden) - 1}")
        stacked = torch.stack([hidden[k] for k in layers], dim=2)  # (B, L, n, D)
        rows = stacked.flatten(2)
        return AdvancedPromptEmbeds(
            text_embeds=[rows[i].to(self.device, self.dtype).clone()
                         for i in range(len(prompts))])

    @property
    def text_embedding_space_version(self) -> str:
        return f"flux2_klein-1-{self.max_sequence_length}-{'.'.join(map(str, self.text_layers))}"

    @property
    def latent_space_version(self) -> str:
        return "flux2_klein-1"

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        steps = self.model_kwargs.shift_steps
        if steps is None:
            steps = 4 if getattr(self, "is_distilled", False) else 50
        shift = EmpiricalShift.from_scheduler_config(self.noise_scheduler.config,
                                                     num_steps=steps)
        return FlowMatchSchedule(settings, shift, image_tokens(1))  # a token per latent pixel

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        from diffusers import Flux2KleinPipeline

        b, c, h, w = latent_model_input.shape
        x = latent_model_input.to(self.device, self.dtype)
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        text, _ = embeds.pad("text_embeds")
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        out = self.model(
            hidden_states=Flux2KleinPipeline._pack_latents(x),
            encoder_hidden_states=text, timestep=(t / 1000.0).to(self.dtype),
            img_ids=Flux2KleinPipeline._prepare_latent_ids(x).to(self.device),
            txt_ids=Flux2KleinPipeline._prepare_text_ids(text).to(self.device),
            guidance=None, return_dict=False)[0]
        return out.permute(0, 2, 1).reshape(b, c, h, w)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = Flux2KleinPipeline(scheduler=scheduler, vae=self.vae, text_encoder=None,
                                      tokenizer=None, transformer=self.model,
                                      is_distilled=self.is_distilled)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        self.check_sample_size(gen_config, "FLUX.2: VAE 8 x patch 2")
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
        return self.vae_scale_factor * 2


class Flux2Klein4BModel(Flux2KleinModel):
    """FLUX.2 [klein] 4B (Qwen3-4B text encoder), upstream's `flux2_klein_4b`."""

    arch = "flux2_klein_4b"


class Flux2Klein9BModel(Flux2KleinModel):
    """FLUX.2 [klein] 9B (Qwen3-8B text encoder), upstream's `flux2_klein_9b`."""

    arch = "flux2_klein_9b"


def keep_text_layers(text_encoder: torch.nn.Module, count: int) -> None:
    """Drop the decoder layers after `count`: the prompt reads hidden states up to layer
    27 of Qwen3's 36, so the last 8 (a fifth of its memory and time) never matter. One
    layer past the deepest one read stays, so that state is not the final-normed one."""
    if count < len(text_encoder.layers):
        text_encoder.layers = text_encoder.layers[:count]
        text_encoder.config.num_hidden_layers = count
        if getattr(text_encoder.config, "layer_types", None):
            text_encoder.config.layer_types = text_encoder.config.layer_types[:count]


def start_latents(pipeline: Any, gen_config: GenerateImageConfig,
                  generator: torch.Generator) -> torch.Tensor:
    """The pipeline's start noise (1, 4C, h, w), drawn on the CPU so a preview is the
    same on every device."""
    c = pipeline.transformer.config.in_channels
    f = pipeline.vae_scale_factor * 2
    return torch.randn((1, c, gen_config.height // f, gen_config.width // f),
                       generator=generator, dtype=torch.float32)


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype
                 ) -> Image.Image:
    """One image from diffusers' Flux2KleinPipeline, called with embeds only. Shared by
    the trainer's previews and the interop tests (the same call on a pipeline that
    loaded the LoRA file through diffusers)."""
    cond, _ = conditional.to(device, dtype).pad("text_embeds")
    kwargs: dict[str, Any] = {}
    if gen_config.guidance_scale > 1.0 and not pipeline.config.is_distilled:
        kwargs["negative_prompt_embeds"], _ = unconditional.to(device, dtype).pad(
            "text_embeds")
    latents = start_latents(pipeline, gen_config, generator).to(device, dtype)
    return pipeline(prompt_embeds=cond, latents=latents, width=gen_config.width,
                    height=gen_config.height, num_inference_steps=gen_config.sample_steps,
                    guidance_scale=gen_config.guidance_scale, generator=generator,
                    output_type="pil", **kwargs).images[0]
