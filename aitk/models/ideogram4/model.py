"""Ideogram4Model: the `ideogram4` arch (Ideogram 4) on diffusers' Ideogram4Pipeline parts.

`name_or_path`: a diffusers folder or hub id with

    transformer/                Ideogram4Transformer2DModel (one packed [text | image]
                                sequence, 2x2 patches of the VAE latents)
    unconditional_transformer/  the same class: the image-only guidance branch
    text_encoder/               Qwen3VLModel (Qwen3-VL-8B; its vision tower is dropped)
    tokenizer/                  Qwen2Tokenizer with Qwen's chat template
    vae/                        AutoencoderKLFlux2 (32 latent channels, BatchNorm stats)
    scheduler/                  FlowMatchEulerDiscreteScheduler (the pipeline sets its
                                own resolution-aware logit-normal sigmas)

Conventions at this arch's edges:
- Latents: the VAE mean patchified 2x2 with Ideogram's channel order (patch row, patch
  column, latent channel; the inverse of the pipeline's decode) and normalised with the
  VAE's BatchNorm mean and std, kept as (B, 128, H/16, W/16).
- Prompts: the pipeline's chat template, each prompt at its own length (positions
  count its tokens, as the pipeline's left padding leaves them); the hidden states after
  Qwen3-VL's layers (0, 3, ..., 33, 35) are concatenated per token into one
  (L_i, 13 x D) row, by the pipeline's own `_get_text_encoder_hidden_states`.
- Packing: [left pad | text | image] with the pipeline's own `_prepare_ids` (position
  ids, segment ids, indicators), padded to the batch's longest prompt.
- Time: Ideogram's model time runs the other way (0 = noise, 1 = clean) and its
  transformer predicts clean - noise. aitk's timestep t (0..1000, 1000 = noise) goes in
  as 1 - t / 1000 and the prediction comes out negated (noise - clean), exactly what
  the pipeline's `scheduler.step(-v, t, ...)` steps with.
- Training: flow matching, no shift read from the scheduler (the pipeline samples on
  its own logit-normal schedule; upstream trains with shift 1).
- Previews: Ideogram4Pipeline itself, with its `encode_prompt` answered from the
  trainer's embeds (see `run_pipeline`); `guidance_scale` g blends the conditional and
  unconditional velocities as g v_cond + (1 - g) v_uncond, the pipeline's own rule (the
  usual CFG form). The unconditional branch has no text: negative prompts are unused.
- LoRA files: `diffusion_model.` + Ideogram's module names with q / k / v fused and
  alpha folded in (aitk.models.ideogram4.lora_keys); LoRA goes on the 34 blocks of
  `transformer` only.
- `low_vram`: the text encoder, the VAE and the unconditional transformer wait on the
  CPU and visit the device to work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from aitk.errors import ModelLoadError
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.ideogram4 import lora_keys
from aitk.models.loading import check_source, freeze, load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "unconditional_transformer", "text_encoder", "tokenizer", "vae",
         "scheduler")
PATCH = 2
MAX_PROMPT_TOKENS = 3072  # upstream's max_text_length default (the pipeline's: 2048)
# Kept in the float dtype by quantization (upstream keeps these out of its layer
# offloading too): the latent and text input projections, the time embedding and its
# projection, the output layer.
TRANSFORMER_QUANT_EXCLUDE = ("input_proj", "llm_cond_proj", "t_embedding*", "adaln_proj",
                             "final_layer*")


class Ideogram4Model(BaseModel):
    arch = "ideogram4"
    use_old_lokr_format = False
    lora_block_prefixes = ("layers.",)
    supports_dora = False  # its files fuse q/k/v (lora_keys): no per-layer magnitude

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.ideogram4.tiny import build_tiny_ideogram4

        build_tiny_ideogram4(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKLFlux2,
            FlowMatchEulerDiscreteScheduler,
            Ideogram4Transformer2DModel,
        )
        from transformers import AutoTokenizer, Qwen3VLModel

        name, arch = str(self.model_config.name_or_path), self.arch
        check_source(name, arch, PARTS)
        # `model.quantize` / `quantize_te`: both transformers and the text encoder are
        # quantized while they load, a block at a time, so none exists whole in float.
        transformer = self.load_denoiser(Ideogram4Transformer2DModel, name, "transformer",
                                         TRANSFORMER_QUANT_EXCLUDE, torch_dtype=self.dtype)
        unconditional = self._load_unconditional(Ideogram4Transformer2DModel, name)
        text_encoder = self.load_text_encoder(Qwen3VLModel, name, "text_encoder",
                                              dtype=self.dtype)
        text_encoder.visual = None  # text to image never shows the encoder an image
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", arch)
        vae = load_part(AutoencoderKLFlux2, name, "vae", arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", arch)
        freeze(transformer, unconditional, text_encoder, vae)
        # The unconditional transformer is idle during training: on the CPU with
        # low_vram (BaseModel's placement), visiting the device for previews.
        self.place_loaded([transformer], idle=[unconditional, text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.unconditional_transformer = unconditional
        self.vae, self.noise_scheduler = vae, scheduler

    def _load_unconditional(self, cls: Any, name: str) -> torch.nn.Module:
        """The guidance branch: never trained, so quantized (with `model.quantize`) to
        the plain qtype, without the transformer's accuracy recovery adapter (whose
        deltas are the trained transformer's)."""
        cfg, sub = self.model_config, "unconditional_transformer"
        if not getattr(cfg, "quantize", False):
            return load_part(cls, name, sub, self.arch, torch_dtype=self.dtype)
        from aitk.models.qtypes import parse_qtype
        from aitk.models.quantized_loading import load_part_quantized

        qtype = parse_qtype(getattr(cfg, "qtype", "qfloat8")).qtype.name
        return load_part_quantized(cls, name, sub, self.arch, qtype,
                                   exclude=TRANSFORMER_QUANT_EXCLUDE, torch_dtype=self.dtype)

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def _bn_stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE BatchNorm's mean and std over the 128 packed channels, shaped for
        (B, 128, h, w) latents (the pipeline applies them in the same channel order)."""
        bn = self.vae.bn
        mean = bn.running_mean.float().view(1, -1, 1, 1).to(device)
        std = torch.sqrt(bn.running_var.float() + self.vae.config.batch_norm_eps)
        return mean, std.view(1, -1, 1, 1).to(device)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, 128, H/16, W/16): the distribution's mean,
        patchified as the pipeline unpatchifies (channels: patch row, patch column,
        latent channel), normalised with the BatchNorm statistics."""
        with torch.no_grad(), self.on_device(self.vae):
            z = self.vae.encode(images.to(self.device, torch.float32)).latent_dist.mode()
        b, c, h, w = z.shape
        z = z.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 3, 5, 1, 2, 4)
        z = z.reshape(b, PATCH * PATCH * c, h // PATCH, w // PATCH)
        mean, std = self._bn_stats(z.device)
        return ((z - mean) / std).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The pipeline's decode: denormalise, unpatchify, decode."""
        z = latents.to(self.device, torch.float32)
        mean, std = self._bn_stats(z.device)
        z = z * std + mean
        b, c4, gh, gw = z.shape
        c = c4 // (PATCH * PATCH)
        z = z.view(b, PATCH, PATCH, c, gh, gw).permute(0, 3, 4, 1, 5, 2)
        z = z.reshape(b, c, gh * PATCH, gw * PATCH)
        with torch.no_grad(), self.on_device(self.vae):
            return self.vae.decode(z).sample

    @property
    def max_text_length(self) -> int:
        tokens = self.model_kwargs.max_text_length
        return int(tokens) if tokens is not None else MAX_PROMPT_TOKENS

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, 13 x D) tensor per prompt: the pipeline's text features of its
        tokens (chat template, tapped layers concatenated per token), each prompt
        encoded alone at its own length (what the pipeline's left padding gives its
        real tokens), truncated to `max_text_length` tokens."""
        from diffusers import Ideogram4Pipeline

        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        te, limit = self.text_encoder, self.max_text_length
        rows = []
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            for prompt in prompts:
                messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False)
                ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt"
                                     ).input_ids[:, :limit].to(where)
                mask = torch.ones_like(ids)
                positions = torch.arange(ids.shape[1], device=where).unsqueeze(0)
                taps = Ideogram4Pipeline._get_text_encoder_hidden_states(te, ids, mask,
                                                                         positions)
                row = torch.stack(taps, dim=0).permute(1, 2, 3, 0).reshape(
                    ids.shape[1], -1)
                rows.append(row.to(self.device, self.dtype).clone())
        return AdvancedPromptEmbeds(text_embeds=rows)

    @property
    def text_embedding_space_version(self) -> str:
        return f"ideogram4-1-{self.max_text_length}"

    @property
    def latent_space_version(self) -> str:
        return "ideogram4-1"  # FLUX.2's VAE, Ideogram's patch order

    # ---- 3. train step -------------------------------------------------------------
    def packed_inputs(self, texts: Sequence[torch.Tensor], grid: tuple[int, int]
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The text region length and the transformer's text inputs for a batch: the
        features left-padded to the longest prompt and zero over the image, with the
        pipeline's position ids, segment ids and indicators."""
        from diffusers import Ideogram4Pipeline

        lengths = [t.shape[0] for t in texts]
        width, b = max(lengths), len(texts)
        features = torch.zeros(b, width + grid[0] * grid[1], texts[0].shape[-1],
                               device=self.device, dtype=self.dtype)
        for i, t in enumerate(texts):
            features[i, width - t.shape[0]:width] = t.to(self.device, self.dtype)
        ids, segments, indicator = Ideogram4Pipeline._prepare_ids(lengths, *grid, width,
                                                                  self.device)
        return width, {"encoder_hidden_states": features, "position_ids": ids,
                       "segment_ids": segments, "indicator": indicator}

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        """aitk's time and target in, Ideogram's at the transformer: model time
        1 - t / 1000 (0 = noise) and the prediction negated (clean - noise -> noise -
        clean), as the pipeline steps with -v."""
        b, c, gh, gw = latent_model_input.shape
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        texts = text_embeddings.expand_to_batch(b).text_embeds
        width, inputs = self.packed_inputs(texts, (gh, gw))
        tokens = latent_model_input.to(self.device, self.dtype).permute(0, 2, 3, 1)
        tokens = tokens.reshape(b, gh * gw, c)
        hidden = torch.cat([tokens.new_zeros(b, width, c), tokens], dim=1)
        out = self.model(hidden_states=hidden, timestep=(1.0 - t / 1000.0).to(self.dtype),
                         return_dict=False, **inputs)[0]
        velocity = -out[:, width:]
        return velocity.reshape(b, gh, gw, c).permute(0, 3, 1, 2)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, Ideogram4Pipeline

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = Ideogram4Pipeline(scheduler=scheduler, vae=self.vae, text_encoder=None,
                                     tokenizer=None, transformer=self.model,
                                     unconditional_transformer=self.unconditional_transformer)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        self.check_sample_size(gen_config, "Ideogram 4: VAE 8 x patch 2")
        was = self.unconditional_transformer.training
        self.unconditional_transformer.eval()  # BaseModel's eval covers its own parts
        try:
            with self.on_device(self.vae, self.unconditional_transformer):
                return run_pipeline(pipeline, gen_config, conditional_embeds, generator,
                                    self.device)
        finally:
            self.unconditional_transformer.train(was)

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


def start_noise(pipeline: Any, gen_config: GenerateImageConfig,
                generator: torch.Generator) -> torch.Tensor:
    """The pipeline's (1, image tokens, 128) start latents, drawn on the CPU so a
    preview is the same on every device."""
    grid = pipeline.vae_scale_factor * pipeline.patch_size
    tokens = (gen_config.height // grid) * (gen_config.width // grid)
    return torch.randn((1, tokens, pipeline.transformer.config.in_channels),
                       generator=generator, dtype=torch.float32)


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, generator: torch.Generator,
                 device: torch.device) -> Image.Image:
    """One image from diffusers' Ideogram4Pipeline, which takes no prompt embeds: it
    encodes its prompt itself, and the trainer's text encoder may be unloaded (cached
    embeddings). So its `encode_prompt` is answered, for this call only, with the
    trainer's features packed by the pipeline's own `_prepare_ids`; the rest (schedule,
    both transformers, guidance, decode) is the pipeline's `__call__` as shipped. The
    features are the pipeline's own encoding (tests/aitk/models/test_ideogram4.py holds
    them to it), so this is the image the pipeline makes from the prompt."""
    [text] = conditional.text_embeds
    length = text.shape[0]

    def encode_prompt(prompt: Any, grid_h: int, grid_w: int, max_sequence_length: int,
                      device: torch.device) -> tuple[torch.Tensor, ...]:
        ids, segments, indicator = pipeline._prepare_ids([length], grid_h, grid_w, length,
                                                         device)
        features = torch.zeros(1, length + grid_h * grid_w, text.shape[-1],
                               dtype=torch.float32, device=device)
        features[0, :length] = text.to(device, torch.float32)
        return features, ids, segments, indicator

    pipeline.encode_prompt = encode_prompt
    try:
        return pipeline(prompt=gen_config.prompt, height=gen_config.height,
                        width=gen_config.width, num_inference_steps=gen_config.sample_steps,
                        guidance_scale=float(gen_config.guidance_scale),
                        guidance_schedule=None, max_sequence_length=length,
                        latents=start_noise(pipeline, gen_config, generator).to(device),
                        generator=generator, output_type="pil").images[0]
    finally:
        del pipeline.encode_prompt
