"""Flux2Model: FLUX.2 [dev] (arch `flux2`) on diffusers' Flux2Pipeline parts.

`name_or_path`: a diffusers folder or hub id (black-forest-labs/FLUX.2-dev) with

    transformer/   Flux2Transformer2DModel (8 double + 48 single blocks, guidance embedding)
    vae/           AutoencoderKLFlux2 (32 latent channels, BatchNorm statistics)
    text_encoder/  Mistral3ForConditionalGeneration (Mistral Small 3.1 24B)
    tokenizer/     its PixtralProcessor (only the text side is used)
    scheduler/     FlowMatchEulerDiscreteScheduler (dynamic exponential shift)

What FLUX.2 [klein] already does is inherited (aitk.models.flux2_klein): the VAE latents
patchified 2x2 and normalised with its BatchNorm statistics, the 4-axis position ids,
the pipeline's empirical mu for the `shift` timestep types (`shift_steps`, default 50),
the kohya/BFL LoRA layout, quantization and low_vram. What differs:

- Text: Mistral with the pipeline's system message (Flux2Pipeline's own encoder, called
  with our text model), padded to `max_sequence_length` (512); the hidden states after
  layers (10, 20, 30) are stacked per token into one (L, 3 x 5120) row. Only Mistral's
  language model is loaded, and of it only the layers up to the deepest one read (31
  of 40): the vision tower, the LM head and 9 layers never leave the disk.
- Guidance: [dev] is guidance-distilled. Training feeds `train.cfg_scale` (1.0 by
  default) to its guidance embedding, as upstream; previews feed `guidance_scale`.
- References (edit): each control image (`batch.control_tensor_list`, up to 3, in
  [0, 1]) is resized to at most 1 MP (or to the training image's area with
  `model_kwargs.match_target_res`), at least 64 px a side (the pipeline's floor), on
  the 16 px grid, encoded like a target, and its
  tokens join after the noisy image's with ids (10 (i + 1), h, w, 0), as the pipeline
  builds them; the prediction is the noisy tokens' part. `condition_noisy_latents`
  returns that token sequence; a batch without controls trains text to image.
- Previews: Flux2Pipeline with embeds, the sample's `ctrl_img` / `ctrl_img_1..3` as its
  `image` list (none: text to image), each resized as training resizes it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from PIL import Image

from aitk.data.controls import open_sample_control
from aitk.errors import ModelError, ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.flux2_klein.model import Flux2KleinModel, keep_text_layers
from aitk.models.loading import check_source, freeze, load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
TEXT_LAYERS = (10, 20, 30)
MAX_PROMPT_TOKENS = 512
ONE_MEGAPIXEL = 1024 * 1024  # the pipeline's cap on a reference image
MIN_REFERENCE_SIDE = 64  # and its floor (Flux2ImageProcessor.check_image_input)
REFERENCE_TIME_STEP = 10  # reference i's first id is 10 (i + 1) (Flux2Pipeline's scale)
# Mistral3ForConditionalGeneration's language-model weights, in the checkpoint layouts of
# transformers 5 and 4: loaded as a bare MistralModel.
LANGUAGE_MODEL_KEYS = {r"^model\.language_model\.": "", r"^language_model\.model\.": ""}


class Flux2Model(Flux2KleinModel):
    arch = "flux2"
    has_multiple_control_images = True
    max_controls: ClassVar[int] = 3
    default_text_layers: ClassVar[tuple[int, ...]] = TEXT_LAYERS

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.flux2.tiny import build_tiny_flux2

        build_tiny_flux2(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKLFlux2,
            FlowMatchEulerDiscreteScheduler,
            Flux2Transformer2DModel,
        )
        from transformers import AutoProcessor

        name, arch = str(self.model_config.name_or_path), self.arch
        check_source(name, arch, PARTS)
        transformer = self.load_denoiser(Flux2Transformer2DModel, name, "transformer",
                                         TRANSFORMER_QUANT_EXCLUDE, torch_dtype=self.dtype)
        text_encoder = self._load_text_model(name)
        tokenizer = load_part(AutoProcessor, name, "tokenizer", arch)
        vae = load_part(AutoencoderKLFlux2, name, "vae", arch, torch_dtype=torch.float32)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", arch)
        self.is_distilled = False  # guidance-distilled, not step-distilled: 50 steps
        freeze(transformer, text_encoder, vae)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)
        self.place_loaded([transformer], idle=[text_encoder, vae])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.vae, self.noise_scheduler = vae, scheduler

    def _load_text_model(self, name: str) -> torch.nn.Module:
        """Mistral's language model alone, cut after the deepest layer read (one past it
        stays, so that layer's state is not the final-normed one)."""
        from transformers import AutoConfig, MistralModel

        config = load_part(AutoConfig, name, "text_encoder", self.arch)
        text_config = getattr(config, "text_config", config)
        layers = self.text_layers
        if min(layers) >= 0:
            text_config.num_hidden_layers = min(text_config.num_hidden_layers,
                                                max(layers) + 1)
        with quiet_transformers():  # the vision tower's and cut layers' keys: unused
            model = load_part(MistralModel, name, "text_encoder", self.arch,
                              config=text_config, dtype=self.dtype,
                              key_mapping=LANGUAGE_MODEL_KEYS)
        keep_text_layers(model, text_config.num_hidden_layers)
        return model

    # ---- 2. text -------------------------------------------------------------------
    @property
    def text_layers(self) -> tuple[int, ...]:
        return tuple(self.model_kwargs.text_encoder_out_layers or self.default_text_layers)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (max_sequence_length, 3 x D) tensor per prompt: Flux2Pipeline's own Mistral
        encoding (system message, chat template, stacked layers), pad tokens included."""
        from diffusers import Flux2Pipeline

        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        te = self.text_encoder
        layers = self.text_layers
        if max(layers) > te.config.num_hidden_layers:
            raise ModelLoadError(f"text_encoder_out_layers {list(layers)} needs a text "
                                 f"encoder with {max(layers)} layers; it has "
                                 f"{te.config.num_hidden_layers}")
        with torch.no_grad(), self.on_device(te):
            rows = Flux2Pipeline._get_mistral_3_small_prompt_embeds(
                te, self.tokenizer, list(prompts), dtype=self.dtype,
                device=next(te.parameters()).device,
                max_sequence_length=self.max_sequence_length,
                hidden_states_layers=layers)
        return AdvancedPromptEmbeds(
            text_embeds=[rows[i].to(self.device, self.dtype).clone()
                         for i in range(len(prompts))])

    @property
    def max_sequence_length(self) -> int:
        tokenizer = getattr(self.tokenizer, "tokenizer", self.tokenizer)
        return self.prompt_token_limit(tokenizer, MAX_PROMPT_TOKENS)

    @property
    def text_embedding_space_version(self) -> str:
        return f"flux2-1-{self.max_sequence_length}-{'.'.join(map(str, self.text_layers))}"

    @property
    def latent_space_version(self) -> str:
        return "flux2_klein-1"  # the same VAE latents as klein

    # ---- 3. train step -------------------------------------------------------------
    def training_guidance(self) -> float:
        return float(getattr(self.train_config, "cfg_scale", None) or 1.0)

    def reference_size(self, control_hw: tuple[int, int], target_hw: tuple[int, int]
                       ) -> tuple[int, int]:
        """(H, W) a reference is encoded at: at most 1 MP (the training image's area with
        `match_target_res`), its aspect kept, on the 16 px grid."""
        h, w = control_hw
        budget = target_hw[0] * target_hw[1] if self.model_kwargs.match_target_res \
            else ONE_MEGAPIXEL
        if self.model_kwargs.match_target_res or h * w > budget:
            scale = math.sqrt(budget / (h * w))
            h, w = h * scale, w * scale
        if min(h, w) < MIN_REFERENCE_SIDE:  # the pipeline refuses smaller references
            scale = MIN_REFERENCE_SIDE / min(h, w)
            h, w = h * scale, w * scale
        grid = self.get_bucket_divisibility()
        return max(grid, round(h) // grid * grid), max(grid, round(w) // grid * grid)

    def reference_latents(self, batch: Any, target_hw: tuple[int, int]
                          ) -> list[torch.Tensor]:
        """One (B, 4C, h, w) latent per control image of the batch (at most 3)."""
        out = []
        for pixels in (batch.control_tensor_list or [])[:self.max_controls]:
            size = self.reference_size(tuple(pixels.shape[-2:]), target_hw)
            if tuple(pixels.shape[-2:]) != size:
                pixels = F.interpolate(pixels.float(), size=size, mode="bilinear",
                                       antialias=True).clamp(0, 1)
            out.append(self.encode_images(pixels * 2 - 1))
        return out

    def condition_noisy_latents(self, noisy_latents: torch.Tensor, batch: Any
                                ) -> torch.Tensor:
        """No controls: the latents as they are. Controls: the token sequence (B, N, 4C),
        the noisy image's tokens followed by each reference's."""
        from diffusers import Flux2Pipeline

        if batch is None or not batch.control_tensor_list:
            return noisy_latents
        h, w = noisy_latents.shape[-2:]
        f = self.vae_scale_factor * 2
        tokens = [Flux2Pipeline._pack_latents(noisy_latents)]
        for ref in self.reference_latents(batch, (h * f, w * f)):
            tokens.append(Flux2Pipeline._pack_latents(ref.to(noisy_latents.device,
                                                              noisy_latents.dtype)))
        return torch.cat(tokens, dim=1)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        from diffusers import Flux2Pipeline as Pipe

        b = latent_model_input.shape[0]
        if latent_model_input.dim() == 4:  # text to image
            c, h, w = latent_model_input.shape[1:]
            tokens = Pipe._pack_latents(latent_model_input)
            ids = Pipe._prepare_latent_ids(latent_model_input)
        else:
            if batch is None or batch.latents is None:
                raise ModelError("flux2: a reference token sequence needs its batch "
                                 "(the latent sizes)")
            c, h, w = batch.latents.shape[1:]
            f = self.vae_scale_factor * 2
            shapes = [tuple(p.shape[-2:]) for p in
                      (batch.control_tensor_list or [])[:self.max_controls]]
            refs = [torch.zeros(1, 1, *(s // f for s in self.reference_size(hw, (h * f, w * f))))
                    for hw in shapes]
            ids = torch.cat([Pipe._prepare_latent_ids(batch.latents[:1]),
                             Pipe._prepare_image_ids(refs, scale=REFERENCE_TIME_STEP)],
                            dim=1).expand(b, -1, -1)
            tokens = latent_model_input
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        text, _ = embeds.pad("text_embeds")
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        guidance = torch.full((b,), self.training_guidance(), device=self.device,
                              dtype=torch.float32)
        out = self.model(hidden_states=tokens.to(self.device, self.dtype),
                         encoder_hidden_states=text, timestep=(t / 1000.0).to(self.dtype),
                         img_ids=ids.to(self.device), guidance=guidance,
                         txt_ids=Pipe._prepare_text_ids(text).to(self.device),
                         return_dict=False)[0]
        return out[:, :h * w].permute(0, 2, 1).reshape(b, c, h, w)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = Flux2Pipeline(scheduler=scheduler, vae=self.vae, text_encoder=None,
                                 tokenizer=None, transformer=self.model)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def preview_references(self, gen_config: GenerateImageConfig) -> list[Image.Image]:
        """The sample's control images at the size training encodes them at
        (`reference_size`), which the pipeline then keeps."""
        paths = (gen_config.ctrl_imgs or [p for p in [gen_config.ctrl_img] if p])
        target = (gen_config.height, gen_config.width)
        images = []
        for path in paths[:self.max_controls]:
            img = open_sample_control(path)
            h, w = self.reference_size((img.height, img.width), target)
            images.append(img if img.size == (w, h)
                          else img.resize((w, h), Image.Resampling.LANCZOS))
        return images

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        """Embedded guidance as [dev] is sampled: no true CFG, so the negative prompt is
        not used."""
        self.check_sample_size(gen_config, "FLUX.2: VAE 8 x patch 2")
        with self.on_device(self.vae):
            return run_pipeline(pipeline, gen_config, conditional_embeds, generator,
                                self.device, self.dtype, self.preview_references(gen_config))


# Kept in the float dtype by quantization: klein's list plus the guidance embedder.
TRANSFORMER_QUANT_EXCLUDE = ("x_embedder", "context_embedder", "time_guidance_embed*",
                             "norm_out*", "proj_out")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' load report lists every checkpoint key the model leaves out; here
    those are left out on purpose."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, generator: torch.Generator,
                 device: torch.device, dtype: torch.dtype,
                 references: list[Image.Image] | None = None) -> Image.Image:
    """One image from diffusers' Flux2Pipeline, called with embeds (and the reference
    images, if any). Shared by the previews and the interop tests. The start noise is
    drawn on the CPU, so a preview is the same on every device."""
    from aitk.models.flux2_klein.model import start_latents

    cond, _ = conditional.to(device, dtype).pad("text_embeds")
    latents = start_latents(pipeline, gen_config, generator).to(device, dtype)
    return pipeline(image=references or None, prompt_embeds=cond, latents=latents,
                    width=gen_config.width, height=gen_config.height,
                    num_inference_steps=gen_config.sample_steps,
                    guidance_scale=gen_config.guidance_scale, generator=generator,
                    output_type="pil").images[0]
