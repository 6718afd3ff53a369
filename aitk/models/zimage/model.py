"""ZImageModel: the `zimage` arch (Z-Image Turbo, base and De-Turbo) on diffusers'
ZImagePipeline parts.

`name_or_path`: a diffusers folder or hub id (Tongyi-MAI/Z-Image-Turbo,
Tongyi-MAI/Z-Image, ostris/Z-Image-De-Turbo) with

    transformer/   ZImageTransformer2DModel (single-stream, 2x2 patches, 3-axis RoPE)
    text_encoder/  Qwen3-4B (loaded without its LM head)
    tokenizer/     Qwen2Tokenizer with Qwen3's chat template
    vae/           FLUX.1's AutoencoderKL (16 latent channels)
    scheduler/     FlowMatchEulerDiscreteScheduler (fixed shift 3)

`model.extras_name_or_path` names where the parts other than the transformer come from
when `name_or_path` holds the transformer only (De-Turbo: Z-Image Turbo's); a local
`name_or_path` folder with its own `text_encoder/` is used whole, as upstream does.

Conventions at this arch's edges:
- Latents: the VAE mean, `(z - shift_factor) * scaling_factor`, (B, 16, H/8, W/8), what
  the pipeline decodes; the transformer takes each item as (C, 1, h, w) and patchifies
  2x2 itself, so image sides are multiples of 16.
- Prompts: Qwen3's chat template (user turn, generation prompt, thinking on, as the
  pipeline writes it); the second-to-last hidden states of the real tokens only, one
  (L_i, 2560) tensor per prompt at its own length (the transformer takes a list).
- Time: Z-Image's runs the other way, 1 = clean: the transformer gets (1000 - t) / 1000
  and predicts clean - noise, so its output is negated into aitk's noise - clean.
- Training: flow matching with the scheduler's fixed shift for the `shift` timestep type.
- `model.assistant_lora_path` (Turbo): the de-distillation adapter is merged into the
  frozen transformer before quantization (aitk.models.assistant) and taken out again for
  previews, as upstream samples Turbo: the previews show the distilled model plus the
  trained LoRA, so sample it as Turbo (guidance 1, about 9 steps).
- Previews: ZImagePipeline with embeds; `guidance_scale` g > 1 runs CFG with the
  pipeline's scale g - 1 (its CFG is zero-based: pos + s (pos - neg)), as upstream.
- LoRA files: `diffusion_model.` + diffusers names with alpha (upstream's layout, what
  diffusers' ZImagePipeline.load_lora_weights converts and ComfyUI maps); LoRA goes on
  the 30 main `layers` (upstream's transformer blocks), not the refiners.
- `low_vram`: the text encoder and VAE wait on the CPU and visit the device to work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from aitk.adapters.keys import from_public_keys, to_public_keys
from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.diffusion.timesteps import FlowShift
from aitk.errors import ModelLoadError
from aitk.models import kl_latents
from aitk.models.assistant import LoraDelta, merge_assistant, removed
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.loading import check_source, freeze, load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

TRANSFORMER_PART = ("transformer",)
OTHER_PARTS = ("text_encoder", "tokenizer", "vae", "scheduler")
MAX_PROMPT_TOKENS = 512
# Kept in the float dtype by quantization (upstream's list): the time and caption
# embedders, the latent input projection and the output layer.
TRANSFORMER_QUANT_EXCLUDE = ("t_embedder*", "cap_embedder*", "all_x_embedder*",
                             "all_final_layer*", "siglip_embedder*")


class ZImageModel(BaseModel):
    arch = "zimage"
    use_old_lokr_format = False
    lora_block_prefixes = ("layers.",)

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.zimage.tiny import build_tiny_zimage

        build_tiny_zimage(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def parts_source(self) -> str:
        """Where the text encoder, tokenizer, VAE and scheduler come from."""
        cfg = self.model_config
        name = str(cfg.name_or_path)
        extras = getattr(cfg, "extras_name_or_path", None)
        if not extras or (Path(name).expanduser() / "text_encoder").is_dir():
            return name
        return str(extras)

    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKL,
            FlowMatchEulerDiscreteScheduler,
            ZImageTransformer2DModel,
        )
        from transformers import AutoTokenizer, Qwen3Model

        name, arch = str(self.model_config.name_or_path), self.arch
        extras = self.parts_source()
        if extras == name:
            check_source(name, arch, TRANSFORMER_PART + OTHER_PARTS)
        else:
            check_source(name, arch, TRANSFORMER_PART)
            check_source(extras, arch, OTHER_PARTS)
        transformer = load_part(ZImageTransformer2DModel, name, "transformer", arch,
                                torch_dtype=self.dtype)
        # Only hidden states are read: the LM head stays on disk.
        text_encoder = load_part(Qwen3Model, extras, "text_encoder", arch, dtype=self.dtype)
        tokenizer = load_part(AutoTokenizer, extras, "tokenizer", arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKL, extras, "vae", arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, extras, "scheduler", arch)
        freeze(transformer, text_encoder, vae)
        self.assistant: dict[str, LoraDelta] = {}
        spec = getattr(self.model_config, "assistant_lora_path", None)
        if spec:
            self.assistant = merge_assistant(transformer, str(spec), "Z-Image")
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.vae, self.noise_scheduler = vae, scheduler

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, C, H/8, W/8), `(z - shift) * scale`."""
        with self.on_device(self.vae):
            return kl_latents.encode(self.vae, images, self.device).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        with self.on_device(self.vae):
            return kl_latents.decode(self.vae, latents, self.device)

    @property
    def max_sequence_length(self) -> int:
        return self.prompt_token_limit(self.tokenizer, MAX_PROMPT_TOKENS)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D) tensor per prompt: the second-to-last hidden states of the
        chat-templated prompt's real tokens (what ZImagePipeline.encode_prompt gives)."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        texts = [self.tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True,
            enable_thinking=True) for p in prompts]
        # Padded on the right to the longest prompt: Qwen3 is causal, so a real token
        # never sees the padding and the result is the pipeline's max-length one.
        tokens = self.tokenizer(texts, padding=True, padding_side="right", truncation=True,
                                max_length=self.max_sequence_length, return_tensors="pt")
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            mask = tokens.attention_mask.to(where).bool()
            hidden = te(input_ids=tokens.input_ids.to(where), attention_mask=mask,
                        output_hidden_states=True, use_cache=False).hidden_states[-2]
        return AdvancedPromptEmbeds(
            text_embeds=[hidden[i][mask[i]].to(self.device, self.dtype).clone()
                         for i in range(len(prompts))])

    @property
    def text_embedding_space_version(self) -> str:
        return f"zimage-1-{self.max_sequence_length}"

    @property
    def latent_space_version(self) -> str:
        return "zimage-1"

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        return FlowMatchSchedule(settings,
                                 shift=FlowShift.from_scheduler_config(
                                     self.noise_scheduler.config),
                                 seq_len=image_tokens(2))  # 2x2 latent patches

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b = latent_model_input.shape[0]
        x = latent_model_input.to(self.device, self.dtype).unsqueeze(2)  # (B, C, 1, h, w)
        captions = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        out = self.model(list(x.unbind(0)), ((1000.0 - t) / 1000.0).to(self.dtype),
                         list(captions.text_embeds), return_dict=False)[0]
        return -torch.stack(out, dim=0).squeeze(2)

    # ---- 4. previews ---------------------------------------------------------------
    def generate_images(self, configs: Sequence[GenerateImageConfig],
                        prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None
                        ) -> list[Image.Image]:
        """As BaseModel's, with the training adapter (if any) taken out."""
        with removed(self.model, getattr(self, "assistant", {})):
            return super().generate_images(configs, prompt_embeds)

    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = ZImagePipeline(scheduler=scheduler, vae=self.vae, text_encoder=None,
                                  tokenizer=None, transformer=self.model)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        self.check_sample_size(gen_config, "Z-Image: VAE 8 x patch 2")
        with self.on_device(self.vae):
            return run_pipeline(pipeline, gen_config, conditional_embeds,
                                unconditional_embeds, generator, self.device, self.dtype)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return to_public_keys(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return from_public_keys(state_dict)  # `diffusion_model.` or `transformer.`

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * 2


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype
                 ) -> Image.Image:
    """One image from diffusers' ZImagePipeline, called with embeds only. Shared by the
    trainer's previews and the interop tests (the same call on a pipeline that loaded
    the LoRA file through diffusers). The start noise is drawn on the CPU, so a preview
    is the same on every device."""
    scale = max(0.0, gen_config.guidance_scale - 1.0)  # the pipeline's CFG is zero-based
    c = pipeline.transformer.in_channels
    f = pipeline.vae_scale_factor
    latents = torch.randn((1, c, gen_config.height // f, gen_config.width // f),
                          generator=generator, dtype=torch.float32)
    cond = [t.to(device, dtype) for t in conditional.text_embeds]
    neg = [t.to(device, dtype) for t in unconditional.text_embeds] if scale > 0 else None
    return pipeline(prompt_embeds=cond, negative_prompt_embeds=neg,
                    guidance_scale=scale, width=gen_config.width,
                    height=gen_config.height, num_inference_steps=gen_config.sample_steps,
                    latents=latents.to(device), generator=generator,
                    output_type="pil").images[0]
