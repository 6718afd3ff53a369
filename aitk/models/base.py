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

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from aitk.prompt_embeds import AdvancedPromptEmbeds

if TYPE_CHECKING:
    from PIL import Image

    from aitk.batch import DataBatch


class ModelError(Exception):
    """A model that cannot do what was asked (bad folder, missing part, unloaded TE)."""


class ModelLoadError(ModelError):
    """`load_model()` failed: the message names the path and what is missing."""


_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """Content digest of one file, cached per (path, inode, size, mtime) in this process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is None:
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        _DIGESTS[key] = digest
    return digest


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
    # LoRA/LoKr attach to the nn.Linear layers whose path (inside get_model_to_train())
    # starts with one of these; override for networks that name their blocks otherwise.
    lora_block_prefixes: ClassVar[tuple[str, ...]] = (
        "blocks.", "transformer_blocks.", "single_transformer_blocks.", "layers.")

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

    def encode_prompts(self, prompts: Iterable[str]) -> dict[str, AdvancedPromptEmbeds]:
        """Embed each distinct prompt once: {prompt: single-item embeds}.

        The trainer calls this for the sample prompts before it unloads the text encoder
        (text embeddings cached), then passes the result to `generate_images`.
        """
        unique = list(dict.fromkeys(prompts))
        if not unique:
            return {}
        if self.text_encoder is None:
            raise ModelError("the text encoder is unloaded; embed the sample prompts with "
                             "encode_prompts() before unloading it")
        with torch.no_grad():
            embeds = self.get_prompt_embeds(unique).detach()
        return {p: embeds.select([i]) for i, p in enumerate(unique)}

    def generate_images(self, configs: Sequence[GenerateImageConfig],
                        prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None
                        ) -> list[Image.Image]:
        """One PIL image per config, deterministic per `config.seed`.

        Each distinct prompt and negative prompt is embedded once (prompts found in
        `prompt_embeds` are not re-encoded), `get_generation_pipeline()` is called once
        and `generate_single_image()` once per config, with a CPU `torch.Generator`
        seeded from the config. Runs under `torch.no_grad()` with the modules in eval
        mode; each module's train/eval flag is restored afterwards.
        """
        if not configs:
            return []
        known = dict(prompt_embeds or {})
        texts = [t for c in configs for t in (c.prompt, c.negative_prompt)]
        modules = [m for m in (self.model, self.vae, self.text_encoder) if m is not None]
        modes = [(sub, sub.training) for m in modules for sub in m.modules()]
        try:
            for m in modules:
                m.eval()
            with torch.no_grad():
                known.update(self.encode_prompts(t for t in texts if t not in known))
                pipeline = self.get_generation_pipeline()
                images = []
                for cfg in configs:
                    generator = torch.Generator(device="cpu").manual_seed(int(cfg.seed))
                    images.append(self.generate_single_image(
                        pipeline, cfg, known[cfg.prompt], known[cfg.negative_prompt],
                        generator))
            return images
        finally:
            for sub, mode in modes:
                sub.training = mode

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
        """A stable fingerprint of the loaded weights, part of every cache key.

        Default: sha256 over the arch, the text-encoder quantization (it changes the
        text embeddings) and the content of every file under `name_or_path` (a hub id
        that is not a local path is hashed by name). File digests are cached per
        (path, size, mtime), so this is cheap after the first call in a process.
        """
        cfg = self.model_config
        h = hashlib.sha256()
        h.update(f"arch={self.arch}\n".encode())
        if getattr(cfg, "quantize_te", False):
            h.update(f"quantize_te={getattr(cfg, 'qtype_te', 'qfloat8')}\n".encode())
        root = Path(cfg.name_or_path)
        if root.is_file():
            h.update(f"{root.name}={file_sha256(root)}\n".encode())
        elif root.is_dir():
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                h.update(f"{path.relative_to(root).as_posix()}={file_sha256(path)}\n"
                         .encode())
        else:
            h.update(f"name={cfg.name_or_path}\n".encode())
        return h.hexdigest()

    def unload_text_encoder(self) -> None:
        """Free the text encoder once text embeddings are cached."""
        self.text_encoder = None
