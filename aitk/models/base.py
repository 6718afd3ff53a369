"""BaseModel: the contract between the trainer and a model architecture.

The trainer calls these hooks in this order (one arch per subclass, `arch` matched
against `model.arch` in the job config):

1. Load: `load_model()` builds the transformer, text encoder(s), tokenizer(s), VAE and
   scheduler from `model_config.name_or_path` and stores them on self.
2. Caching (optional, before training): `encode_images()` per image (latent cache) and
   `get_prompt_embeds()` per caption (text-embed cache; `AdvancedPromptEmbeds.save`).
3. Train step: clean latents (cache or `encode_images`) -> noise and timesteps are
   sampled -> `add_noise()` -> `condition_noisy_latents(noisy, batch)` ->
   `get_noise_prediction(latent_model_input, timestep, text_embeddings)` under autograd
   -> MSE against `get_loss_target(noise=..., batch=...)`.
4. Previews: `generate_images()` encodes prompts with `get_prompt_embeds()`, calls
   `get_generation_pipeline()` once and `generate_single_image()` per prompt. The
   pipeline receives embeds only, never text.
5. Saving: full fine-tunes use `save_model()`; LoRA files go through
   `convert_lora_weights_before_save/load()` (public keys, `diffusion_model.` prefix).

Conventions (keep them exactly):
- Pixels (B, 3, H, W) in [-1, 1]; control tensors arrive in [0, 1].
- Latents (B, C, h, w); video latents (B, C, frames, h, w).
- Timesteps cross this API on 0..1000 where 1000 is pure noise; convert to the
  network's own convention inside `get_noise_prediction`.
- Flow-matching target is `noise - clean`.
- Prompt embeds are per item, 2-D (L, D), padded only at the model call.
- Gradient checkpointing uses `torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)` whenever the flag is set and `torch.is_grad_enabled()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from aitk.prompt_embeds import AdvancedPromptEmbeds

if TYPE_CHECKING:
    from PIL import Image

    from aitk.batch import DataBatch


class ModelSettings(Protocol):
    """What a model reads from the job's `model:` section (aitk.config.ModelConfig)."""

    arch: str
    name_or_path: str
    quantize: bool
    quantize_te: bool
    qtype: str
    qtype_te: str
    model_kwargs: dict[str, Any]


@dataclass
class GenerateImageConfig:
    """One preview image: fixed prompt and seed so previews are comparable across steps."""

    prompt: str
    width: int = 512
    height: int = 512
    seed: int = 42
    guidance_scale: float = 4.0
    sample_steps: int = 20
    negative_prompt: str = ""
    ctrl_img: str | None = None
    num_frames: int = 1
    output_path: str | None = None


class BaseModel:
    arch: ClassVar[str] = ""
    # New archs use the new LoKr format; only legacy archs set this True.
    use_old_lokr_format: ClassVar[bool] = False
    encode_control_in_text_embeddings: ClassVar[bool] = False
    has_multiple_control_images: ClassVar[bool] = False
    te_padding_side: ClassVar[str] = "right"

    def __init__(self, model_config: ModelSettings, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.model_config = model_config
        self.device = torch.device(device)
        self.dtype = dtype
        self.model: nn.Module | None = None
        self.vae: nn.Module | None = None
        self.text_encoder: nn.Module | None = None
        self.tokenizer: Any = None
        self.noise_scheduler: Any = None

    # `transformer` and `unet` are aliases of `model`, as model authors expect.
    @property
    def transformer(self) -> nn.Module | None:
        return self.model

    @transformer.setter
    def transformer(self, value: nn.Module | None) -> None:
        self.model = value

    @property
    def unet(self) -> nn.Module | None:
        return self.model

    @unet.setter
    def unet(self, value: nn.Module | None) -> None:
        self.model = value

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        raise NotImplementedError

    # ---- 2. encoders ---------------------------------------------------------------
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> latents (B, C, h, w)."""
        raise NotImplementedError

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents -> pixels (B, 3, H, W) in [-1, 1]."""
        raise NotImplementedError

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One 2-D (L, D) tensor per prompt, at its natural length."""
        raise NotImplementedError

    # ---- 3. train step -------------------------------------------------------------
    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor,
                  timesteps: torch.Tensor) -> torch.Tensor:
        """Flow matching: x_t = (1 - s) * clean + s * noise, s = t / 1000 per item."""
        s = (timesteps.to(torch.float32) / 1000.0).view(-1, *([1] * (clean.ndim - 1)))
        return ((1.0 - s) * clean.float() + s * noise.float()).to(clean.dtype)

    def condition_noisy_latents(self, noisy_latents: torch.Tensor,
                                batch: DataBatch) -> torch.Tensor:
        """Hook for control/reference conditioning; identity by default."""
        return noisy_latents

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds,
                             batch: DataBatch | None = None, **kwargs: Any) -> torch.Tensor:
        """Forward pass under autograd; timestep on 0..1000 (1000 = pure noise)."""
        raise NotImplementedError

    def get_loss_target(self, *, noise: torch.Tensor, batch: DataBatch,
                        clean_latents: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching velocity from data to noise: noise - clean."""
        clean = clean_latents if clean_latents is not None else batch.latents
        if clean is None:
            raise ValueError("get_loss_target needs clean latents")
        return noise - clean

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        raise NotImplementedError

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        raise NotImplementedError

    def generate_images(self, configs: list[GenerateImageConfig]) -> list[Image.Image]:
        """Embeds each prompt, builds the pipeline once, one image per config."""
        raise NotImplementedError  # implemented in the base for every arch

    # ---- 5. saving -----------------------------------------------------------------
    def save_model(self, output_path: str, dtype: torch.dtype = torch.float32) -> None:
        raise NotImplementedError

    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        """Internal adapter names -> public names (`diffusion_model.` prefix)."""
        return state_dict

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        """Public names -> the internal names `load` expects; inverse of the above."""
        return state_dict

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        """Image sides must be multiples of this (vae_scale_factor * patch_size)."""
        return 16

    @property
    def text_embedding_space_version(self) -> str:
        """Bump when get_prompt_embeds changes, so on-disk caches invalidate."""
        return "1"

    @property
    def latent_space_version(self) -> str:
        """Bump when encode_images changes, so on-disk caches invalidate."""
        return "1"

    def get_model_to_train(self) -> nn.Module:
        """The module LoRA attaches to."""
        if self.model is None:
            raise RuntimeError("load_model() has not run")
        return self.model

    def identity(self) -> str:
        """A stable fingerprint of the loaded weights, part of every cache key."""
        raise NotImplementedError

    def unload_text_encoder(self) -> None:
        """Free the text encoder once text embeddings are cached."""
        self.text_encoder = None
