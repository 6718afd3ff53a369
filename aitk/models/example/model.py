"""ExampleModel: the `example` arch, a complete BaseModel subclass to copy from.

`name_or_path` is a folder written by `python -m aitk example-model DIR` (or any folder
with the same layout), each part saved with `save_pretrained`:

    transformer/   ExampleTransformer (aitk.models.example.transformer), a minimal DiT
    text_encoder/  transformers T5EncoderModel
    tokenizer/     ByT5Tokenizer (bytes; needs no vocabulary file)
    vae/           diffusers AutoencoderKL
    scheduler/     diffusers FlowMatchEulerDiscreteScheduler (optional; default config)

`model_kwargs` read here: `attention_backend: native|flash` (default native).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from aitk.adapters.keys import from_public_keys, to_public_keys
from aitk.errors import ModelLoadError
from aitk.models import kl_latents
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.example.sizes import MAX_TOKENS
from aitk.models.loading import freeze
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "text_encoder", "tokenizer", "vae")
# Kept in float32 by quantization: the token/time/text embedders and the output layer are
# tiny and the most sensitive to rounding.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder", "t_embedder*", "context_embedder",
                             "pooled_embedder", "adaLN_out", "proj_out")


class ExampleModel(BaseModel):
    arch = "example"
    use_old_lokr_format = False
    supports_dora = True

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.example.build import build_example_model

        build_example_model(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
        from transformers import AutoTokenizer, T5EncoderModel

        from aitk.models.example.transformer import ExampleTransformer

        root = Path(self.model_config.name_or_path).expanduser()
        if not root.is_dir():
            raise ModelLoadError(f"model folder {root} does not exist; build one with "
                                 f"`python -m aitk example-model {root}`")
        missing = [p for p in PARTS if not (root / p).is_dir()]
        if missing:
            raise ModelLoadError(f"model folder {root} lacks {', '.join(missing)}/ "
                                 f"(expected {', '.join(PARTS)}/)")
        try:
            transformer = self.load_denoiser(ExampleTransformer, str(root), "transformer",
                                             TRANSFORMER_QUANT_EXCLUDE,
                                             torch_dtype=self.dtype)
            text_encoder = self.load_text_encoder(T5EncoderModel, str(root), "text_encoder",
                                                  dtype=self.dtype)
            tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
            # The VAE stays float32: encode/decode quality matters more than its size.
            vae = AutoencoderKL.from_pretrained(root / "vae", torch_dtype=torch.float32)
            if (root / "scheduler").is_dir():
                scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(
                    root / "scheduler")
            else:
                scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"cannot load the example model from {root}: {exc}") from exc

        freeze(transformer, text_encoder, vae)
        # Small enough to keep every part on the device: `low_vram` moves nothing here.
        self.place_loaded([transformer, text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.vae, self.noise_scheduler = vae, scheduler

        transformer.set_attention_backend(self.model_kwargs.attention_backend)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> normalised latents (B, C, H/f, W/f).

        The distribution's mean, not a sample: cached latents are then deterministic.
        """
        return kl_latents.encode(self.vae, images, self.device).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return kl_latents.decode(self.vae, latents, self.device)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D) tensor per prompt: the encoder states of its real tokens only."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        tokens = self.tokenizer(list(prompts), padding=True, truncation=True,
                                max_length=MAX_TOKENS, return_tensors="pt")
        ids = tokens.input_ids.to(self.device)
        mask = tokens.attention_mask.to(self.device)
        with self.text_encoder_grad():  # a full fine-tune may train the encoder
            states = self.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        lengths = mask.sum(dim=1).tolist()
        return AdvancedPromptEmbeds(
            text_embeds=[states[i, :n].to(self.dtype).clone() for i, n in enumerate(lengths)])

    def text_encoder_parts(self) -> dict[str, torch.nn.Module]:
        return {} if self.text_encoder is None else {"text_encoder": self.text_encoder}

    # ---- 3. train step -------------------------------------------------------------
    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        b = latent_model_input.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        context, mask = embeds.pad("text_embeds", padding_side=self.te_padding_side)
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(b)
        # This network's native time scale is the API's (0..1000, 1000 = pure noise), so
        # no flip or rescale is needed here; other archs convert at exactly this point.
        return self.model(latent_model_input.to(self.device, self.dtype), t, context, mask)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from aitk.models.example.pipeline import ExamplePipeline

        return ExamplePipeline(
            predict=lambda x, t, e: self.get_noise_prediction(x, t, e),
            decode=self.decode_latents,
            scheduler_config=dict(self.noise_scheduler.config),
            latent_channels=self.vae.config.latent_channels,
            vae_scale_factor=self.vae_scale_factor,
            divisibility=self.get_bucket_divisibility(), device=self.device, dtype=self.dtype)

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        pixels = pipeline(conditional_embeds, unconditional_embeds, width=gen_config.width,
                          height=gen_config.height,
                          num_inference_steps=gen_config.sample_steps,
                          guidance_scale=gen_config.guidance_scale, generator=generator)
        return tensor_to_pil(pixels[0])

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return to_public_keys(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return from_public_keys(state_dict)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return self.vae_scale_factor * self.model.config.patch_size


def tensor_to_pil(pixels: torch.Tensor) -> Image.Image:
    """(3, H, W) in [-1, 1] -> RGB PIL image."""
    arr = ((pixels.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return Image.fromarray(np.ascontiguousarray(arr.permute(1, 2, 0).cpu().numpy()), "RGB")
