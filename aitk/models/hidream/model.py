"""HiDreamModel: HiDream-I1 Full, Dev and Fast (arch `hidream`) on diffusers' HiDream
classes.

`name_or_path` is a diffusers HiDream folder or hub id (`HiDream-ai/HiDream-I1-Full`)
with `transformer/ text_encoder/ tokenizer/ text_encoder_2/ tokenizer_2/
text_encoder_3/ tokenizer_3/ vae/ scheduler/`. The fourth text encoder, Llama 3.1 8B
Instruct, comes from `model_kwargs.llama_model_path` (upstream's knob and default), or
from `text_encoder_4/ tokenizer_4/` of that folder when it has them and the knob is unset.

- Latents: VAE mean, `(z - shift_factor) * scaling_factor` (FLUX.1's VAE), (B, 16, H/8,
  W/8); the transformer patchifies 2x2 itself (a non-square image is padded to its
  token budget and masked), so image sides are multiples of 16.
- Text, as HiDreamImagePipeline encodes it: the two CLIPs' projected pooled outputs
  concatenated (`pooled_embeds` (1, 768 + 1280)); T5's states over
  `max_sequence_length` (128) padded tokens (`text_embeds` (128, 4096)); every Llama
  layer's hidden states over the same 128 tokens, of which the transformer reads the
  layers its config lists (`llama_layers`): those are kept, flattened per token
  (`llama_embeds` (128, n * 4096)) and restacked at the model call.
- Timesteps go in on 0..1000 as they are; the transformer's output points from the
  noise to the image, so the prediction is its negation (upstream and the pipeline do
  the same), the velocity `noise - clean`.
- Training schedule: flow matching with the scheduler config's fixed shift (`shift`,
  or UniPC's `flow_shift`; 3.0 otherwise, upstream's training shift).
- LoRA files: `transformer.` + diffusers names (ComfyUI's HiDream uses the same names),
  the scale folded into `lora_B` (aitk.adapters.alpha_folding): diffusers'
  `HiDreamImagePipeline.load_lora_weights` and ComfyUI read it.
- `low_vram`: the four text encoders stay on the CPU except while embedding, the VAE
  except while encoding/decoding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from aitk.adapters.alpha_folding import fold_alphas, unfolded_alphas
from aitk.adapters.keys import from_public_keys
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import ModelLoadError
from aitk.models import kl_latents
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.hidream.arch import LLAMA_REPO
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
         "text_encoder_3", "tokenizer_3", "vae", "scheduler")
LORA_PREFIX = "transformer."
MESSAGE_NAME = "HiDream"
TEXT_TOKENS = 128  # HiDreamImagePipeline's max_sequence_length default, upstream's too
CLIP_TOKENS = 218  # the pipeline's cap on the long-context CLIPs
TRAIN_SHIFT = 3.0  # upstream's training scheduler when the model's config names none
# Kept in float by quantization: the embedders, the caption projections and the output.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder*", "t_embedder*", "p_embedder*", "final_layer*",
                             "caption_projection*")
TE_QUANT_EXCLUDE = ("*embeddings*", "*embed_tokens*", "text_projection")


def patches_to_image(out: torch.Tensor, height: int, width: int, patch: int) -> torch.Tensor:
    """The transformer's training-mode output (B, C, S, p*p), S >= (H/p)(W/p) tokens
    (padded for a non-square image), -> (B, C, H, W). In eval mode diffusers unpatchifies
    itself; in train mode it hands back this layout."""
    b, c = out.shape[:2]
    ph, pw = height // patch, width // patch
    x = out[:, :, : ph * pw].reshape(b, c, ph, pw, patch, patch)
    return x.permute(0, 1, 2, 4, 3, 5).reshape(b, c, height, width)


def keep_sample_size(pipeline: Any, width: int, height: int) -> None:
    """HiDreamImagePipeline rescales every request to the area of its default sample
    size (1024 x 1024): made that area (a hair above, so its floor to a multiple of 16
    keeps each side), the preview is rendered at the asked size."""
    pipeline.default_sample_size = (math.sqrt(width * height) / pipeline.vae_scale_factor
                                    * (1.0 + 1e-6))


class HiDreamModel(BaseModel):
    arch = "hidream"
    use_old_lokr_format = False
    lora_block_prefixes = ("double_stream_blocks.", "single_stream_blocks.")

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.hidream.tiny import build_tiny_hidream

        build_tiny_hidream(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKL,
            FlowMatchEulerDiscreteScheduler,
            HiDreamImageTransformer2DModel,
        )
        from transformers import (
            AutoTokenizer,
            CLIPTextModelWithProjection,
            LlamaModel,
            T5EncoderModel,
        )

        from aitk.models.loading import check_source, freeze, load_part, load_scheduler

        name = str(self.model_config.name_or_path)
        check_source(name, MESSAGE_NAME, PARTS)

        def part(cls: Any, sub: str, source: str = name, **kw: Any) -> Any:
            return load_part(cls, source, sub, MESSAGE_NAME, **kw)

        transformer = part(HiDreamImageTransformer2DModel, "transformer",
                           torch_dtype=self.dtype)
        encoders = [part(CLIPTextModelWithProjection, "text_encoder", dtype=self.dtype),
                    part(CLIPTextModelWithProjection, "text_encoder_2", dtype=self.dtype),
                    part(T5EncoderModel, "text_encoder_3", dtype=self.dtype)]
        tokenizers = [part(AutoTokenizer, sub)
                      for sub in ("tokenizer", "tokenizer_2", "tokenizer_3")]
        llama, llama_tokenizer = self._load_llama(LlamaModel, AutoTokenizer)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = part(AutoencoderKL, "vae", torch_dtype=torch.float32)
        scheduler = load_scheduler(name, MESSAGE_NAME, FlowMatchEulerDiscreteScheduler)

        freeze(transformer, *encoders, llama, vae)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        for encoder in (*encoders, llama):
            self.quantize_text_encoder(encoder, exclude=TE_QUANT_EXCLUDE)
        self.place_loaded([transformer], idle=[*encoders, llama, vae])
        self.model, self.vae, self.noise_scheduler = transformer, vae, scheduler
        self.text_encoder, self.text_encoder_2, self.text_encoder_3 = encoders
        self.tokenizer, self.tokenizer_2, self.tokenizer_3 = tokenizers
        self.text_encoder_4, self.tokenizer_4 = llama, llama_tokenizer

    def _load_llama(self, model_cls: Any, tokenizer_cls: Any) -> tuple[Any, Any]:
        """text_encoder_4 / tokenizer_4 from `model_kwargs.llama_model_path` (a folder or
        hub id holding the Llama itself) when set, else from the model folder when it has
        them (the tiny model), else from upstream's default repo."""
        from aitk.models.loading import load_part

        name = str(self.model_config.name_or_path)
        configured = self.model_kwargs.llama_model_path
        if configured is None and (Path(name).expanduser() / "text_encoder_4").is_dir():
            source, model_sub, tok_sub = name, "text_encoder_4", "tokenizer_4"
        else:
            source, model_sub, tok_sub = configured or LLAMA_REPO, "", ""
        llama = load_part(model_cls, source, model_sub, MESSAGE_NAME, dtype=self.dtype)
        tokenizer = load_part(tokenizer_cls, source, tok_sub, MESSAGE_NAME)
        tokenizer.pad_token = tokenizer.eos_token  # as HiDreamImagePipeline sets it
        return llama, tokenizer

    @property
    def max_sequence_length(self) -> int:
        return int(self.model_kwargs.max_sequence_length or TEXT_TOKENS)

    @property
    def llama_layers(self) -> list[int]:
        """The Llama layers the transformer reads, each once, in order."""
        return sorted(set(self.model.config.llama_layers))

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

    def _tokens(self, tokenizer: Any, prompts: list[str], limit: int) -> Any:
        return tokenizer(prompts, padding="max_length", truncation=True,
                         max_length=min(self.max_sequence_length, limit),
                         add_special_tokens=True, return_tensors="pt")

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """Per prompt: T5 (L, D_t5), the used Llama layers (L, n * D_llama) and both CLIPs'
        pooled (1, P1 + P2), each as HiDreamImagePipeline encodes them."""
        if self.text_encoder is None or self.text_encoder_4 is None:
            raise ModelLoadError("the text encoders are unloaded (text embeddings cached)")
        prompts = list(prompts)
        with torch.no_grad():
            pooled = []
            for tokenizer, encoder in ((self.tokenizer, self.text_encoder),
                                       (self.tokenizer_2, self.text_encoder_2)):
                ids = self._tokens(tokenizer, prompts, CLIP_TOKENS).input_ids
                with self.on_device(encoder):
                    pooled.append(encoder(ids.to(self.device), output_hidden_states=True)[0])
            t5_in = self._tokens(self.tokenizer_3, prompts, self.tokenizer_3.model_max_length)
            with self.on_device(self.text_encoder_3):
                t5 = self.text_encoder_3(t5_in.input_ids.to(self.device),
                                         attention_mask=t5_in.attention_mask.to(self.device))[0]
            llama_in = self._tokens(self.tokenizer_4, prompts,
                                    self.tokenizer_4.model_max_length)
            with self.on_device(self.text_encoder_4):
                out = self.text_encoder_4(llama_in.input_ids.to(self.device),
                                          attention_mask=llama_in.attention_mask.to(self.device),
                                          output_hidden_states=True)
        layers = torch.stack([out.hidden_states[1 + k] for k in self.llama_layers])
        n, b, length, dim = layers.shape
        llama = layers.permute(1, 2, 0, 3).reshape(b, length, n * dim).to(self.dtype)
        pooled_all = torch.cat(pooled, dim=-1).to(self.dtype)
        t5 = t5.to(self.dtype)
        return AdvancedPromptEmbeds(
            text_embeds=[t5[i].clone() for i in range(b)],
            llama_embeds=[llama[i].clone() for i in range(b)],
            pooled_embeds=[pooled_all[i:i + 1].clone() for i in range(b)])

    def unload_text_encoder(self) -> None:
        self.text_encoder = self.text_encoder_2 = None
        self.text_encoder_3 = self.text_encoder_4 = None

    def llama_stack(self, llama: torch.Tensor) -> torch.Tensor:
        """(B, L, n * D) -> what the transformer indexes by Llama layer: (max layer + 1,
        B, L, D), the used layers filled, the others zero (never read)."""
        used = self.llama_layers
        b, length, flat = llama.shape
        per_layer = llama.reshape(b, length, len(used), flat // len(used)).permute(2, 0, 1, 3)
        full = per_layer.new_zeros((used[-1] + 1, *per_layer.shape[1:]))
        full[used] = per_layer
        return full

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
        from aitk.diffusion.timesteps import FlowShift

        config = self.noise_scheduler.config
        shift = config.get("shift", None) or config.get("flow_shift", None) or TRAIN_SHIFT
        return FlowMatchSchedule(settings, shift=FlowShift(shift=float(shift)),
                                 seq_len=image_tokens(2))  # 2x2 latent patches

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b, _, h, w = latent_model_input.shape
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        t5, _ = embeds.pad("text_embeds")  # all max_sequence_length long: no padding
        llama, _ = embeds.pad("llama_embeds")
        pooled = torch.cat(embeds["pooled_embeds"])
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        x = latent_model_input.to(self.device, self.dtype)
        out = self.model(hidden_states=x, timesteps=t.to(self.dtype),
                         encoder_hidden_states_t5=t5,
                         encoder_hidden_states_llama3=self.llama_stack(llama),
                         pooled_embeds=pooled, return_dict=False)[0]
        if self.model.training and not self.model.config.force_inference_output:
            # diffusers' own condition for handing back the patch layout
            out = patches_to_image(out, h, w, self.model.config.patch_size)
        return -out

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline

        shift = self.training_schedule.shift.shift
        pipeline = HiDreamImagePipeline(
            transformer=self.model, vae=self.vae,
            scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift),
            text_encoder=None, tokenizer=self.tokenizer, text_encoder_2=None,
            tokenizer_2=self.tokenizer_2, text_encoder_3=None, tokenizer_3=self.tokenizer_3,
            text_encoder_4=None, tokenizer_4=self.tokenizer_4)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        """True CFG against the negative prompt when `guidance_scale` > 1 (Full; Dev and
        Fast sample at 1: no CFG), the pipeline's Euler flow sampler with the model's
        shift, embeds only."""
        self.check_sample_size(gen_config, "HiDream: VAE 8 x patch 2")
        keep_sample_size(pipeline, gen_config.width, gen_config.height)
        kwargs = self.pipeline_embeds(conditional_embeds, unconditional_embeds)
        # The pipeline's latent size: its VAE factor is 8 whatever the VAE (the tiny one too).
        f = pipeline.vae_scale_factor
        noise = torch.randn((1, self.model.config.in_channels, gen_config.height // f,
                             gen_config.width // f), generator=generator, dtype=torch.float32)
        out = pipeline(**kwargs, latents=noise.to(self.device, self.dtype),
                       width=gen_config.width, height=gen_config.height,
                       num_inference_steps=gen_config.sample_steps,
                       guidance_scale=gen_config.guidance_scale, generator=generator,
                       output_type="latent").images
        # Decoded here in float32: the pipeline would hand bf16 latents to the fp32 VAE.
        pixels = self.decode_latents(out)
        return pipeline.image_processor.postprocess(pixels, output_type="pil")[0]

    def pipeline_embeds(self, cond: AdvancedPromptEmbeds, uncond: AdvancedPromptEmbeds
                        ) -> dict[str, torch.Tensor]:
        """One prompt and its negative as HiDreamImagePipeline takes them."""
        def one(embeds: AdvancedPromptEmbeds) -> tuple[torch.Tensor, ...]:
            e = embeds.select([0]).to(self.device, self.dtype)
            return (e.text_embeds[0][None], self.llama_stack(e["llama_embeds"][0][None]),
                    e.pooled_embeds[0])

        t5, llama, pooled = one(cond)
        neg_t5, neg_llama, neg_pooled = one(uncond)
        return {"prompt_embeds_t5": t5, "prompt_embeds_llama3": llama,
                "pooled_prompt_embeds": pooled, "negative_prompt_embeds_t5": neg_t5,
                "negative_prompt_embeds_llama3": neg_llama,
                "negative_pooled_prompt_embeds": neg_pooled}

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
