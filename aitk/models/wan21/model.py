"""Wan 2.1 video models on diffusers: `wan21` (text to video, 1.3B and 14B) and
`wan21_i2v` (image to video, first-frame condition plus CLIP image embeddings).

`name_or_path`: a diffusers folder or hub id (e.g. Wan-AI/Wan2.1-T2V-1.3B-Diffusers,
Wan-AI/Wan2.1-T2V-14B-Diffusers, Wan-AI/Wan2.1-I2V-14B-480P-Diffusers) with

    transformer/     WanTransformer3DModel (patch (1, 2, 2), timesteps on 0..1000)
    vae/             AutoencoderKLWan (causal 3D: 8x space, 4x time; F = 4k + 1 frames)
    text_encoder/    UMT5EncoderModel         tokenizer/  its T5 tokenizer
    scheduler/       UniPCMultistepScheduler (flow prediction, `flow_shift`)
    image_encoder/   CLIPVisionModel, image_processor/  (i2v 2.1 only)

Conventions at this arch's edges (aitk.models.base):
- Pixels (B, 3, F, H, W) in [-1, 1]; an image (B, 3, H, W) is a 1-frame video.
  Latents (B, z, (F - 1) / 4 + 1, H / 8, W / 8), the posterior mean normalised per
  channel with the VAE config's `latents_mean` / `latents_std` (as WanPipeline).
- Prompts: UMT5 last hidden states of the real tokens (L, D); at the model call they
  are zero-padded to 512 tokens, exactly what WanPipeline feeds the transformer.
- Training: flow matching, shift = the scheduler config's `flow_shift` (or `shift`)
  for the `shift` timestep type; target noise - clean.
- LoRA files: `diffusion_model.` + original Wan names with alpha (aitk.models.wan21
  .lora_keys), the layout ComfyUI and diffusers' load_lora_weights read.
- Previews: WanPipeline / WanImageToVideoPipeline with embeds only; a list of PIL frames
  for num_frames > 1, one image for num_frames == 1.
- i2v: the transformer input is [noisy | 4 first-frame mask channels | VAE latents of
  (first frame, zeros...)], as WanImageToVideoPipeline builds it. In training the
  first frame is the batch's own (its pixels, or the first latent frame decoded when
  latents are cached); in previews it is `ctrl_img`, resized to the sample size (a
  mid-grey frame when a sample has none, with one warning).
"""

from __future__ import annotations

import contextlib
import html
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from PIL import Image

from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.diffusion.timesteps import FlowShift
from aitk.errors import ModelLoadError
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.loading import freeze, load_part, load_scheduler
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.wan21.lora_keys import from_wan_keys, to_wan_keys
from aitk.models.wan21.tiny import TEXT_LEN, WAN21, WAN21_I2V, WanVariant, build_tiny_wan

# Kept in the float dtype by quantization: the time/text/image embedders and the head.
TRANSFORMER_QUANT_EXCLUDE = ("condition_embedder*", "proj_out")
MASK_CHANNELS = 4  # the i2v first-frame mask: one channel per frame of a 4-frame group


def clean_prompt(text: str) -> str:
    """WanPipeline's cleaning without ftfy: HTML entities decoded, whitespace folded."""
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text))).strip()


def as_video(pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (B, 3, 1, H, W); 5-D pixels pass through."""
    if pixels.ndim == 4:
        return pixels[:, :, None]
    if pixels.ndim != 5:
        raise ValueError(f"expected (B, 3, H, W) or (B, 3, F, H, W) pixels, got "
                         f"{tuple(pixels.shape)}")
    return pixels


class Wan21Model(BaseModel):
    arch = "wan21"
    use_old_lokr_format = False
    is_video: ClassVar[bool] = True
    lora_block_prefixes = ("blocks.",)
    tiny_variant: ClassVar[WanVariant] = WAN21

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        build_tiny_wan(target, cls.tiny_variant, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
        from transformers import AutoTokenizer, UMT5EncoderModel

        cfg = self.model_config
        name = str(cfg.name_or_path)
        self.model = self.load_transformers(name)
        text_encoder = self.load_text_encoder(UMT5EncoderModel, name, "text_encoder",
                                              dtype=self.dtype)
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", self.arch)
        # The VAE stays float32: encode/decode quality matters more than its size.
        vae = load_part(AutoencoderKLWan, name, "vae", self.arch, dtype=torch.float32)
        # UniPC for the Wan-AI repos; FlowMatchEuler in some re-uploads.
        scheduler = load_scheduler(name, self.arch, UniPCMultistepScheduler)
        freeze(text_encoder, vae)
        self.place_loaded([], idle=[text_encoder, vae])
        self.text_encoder, self.tokenizer, self.vae = text_encoder, tokenizer, vae
        self.noise_scheduler = scheduler
        self.quantize_text_encoder(text_encoder)
        self.load_extras(name)

    def load_transformers(self, name: str) -> torch.nn.Module:
        return self.load_transformer(name, "transformer")

    def load_transformer(self, name: str, subfolder: str,
                         where: torch.device | None = None) -> torch.nn.Module:
        """One denoiser, frozen, quantized on the CPU when asked, then moved to `where`
        (the device by default)."""
        from diffusers import WanTransformer3DModel

        transformer = self.load_denoiser(WanTransformer3DModel, name, subfolder,
                                         TRANSFORMER_QUANT_EXCLUDE, dtype=self.dtype)
        freeze(transformer)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        return transformer.to(where or self.device)

    def load_extras(self, name: str) -> None:
        """i2v: the image encoder; nothing for text to video."""

    @property
    def transformers(self) -> list[torch.nn.Module]:
        """Every denoiser (one for 2.1, two experts for 2.2)."""
        return [self.model]

    # ---- 2. encoders ---------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** len(self.vae.temperal_downsample)

    def _latent_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(shape)
        std = torch.tensor(cfg.latents_std, dtype=torch.float32).view(shape)
        return mean.to(like.device), std.to(like.device)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) or (B, 3, F, H, W) in [-1, 1] -> (B, z, (F-1)/4+1, H/8, W/8):
        the posterior mean, normalised per channel."""
        with torch.no_grad(), self.on_device(self.vae):
            x = as_video(images).to(self.device, torch.float32)
            z = self.vae.encode(x).latent_dist.mean
        mean, std = self._latent_stats(z)
        return ((z - mean) / std).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, z, f, h, w) -> pixels (B, 3, F, H, W) in [-1, 1]."""
        z = latents.to(self.device, torch.float32)
        mean, std = self._latent_stats(z)
        with torch.no_grad(), self.on_device(self.vae):
            return self.vae.decode(z * std + mean).sample.clamp(-1, 1)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D) tensor per prompt: UMT5's last hidden states of its real tokens."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        tokens = self.tokenizer([clean_prompt(p) for p in prompts], max_length=TEXT_LEN,
                                padding="max_length", truncation=True,
                                add_special_tokens=True, return_tensors="pt")
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            ids, mask = tokens.input_ids.to(where), tokens.attention_mask.to(where)
            states = te(input_ids=ids, attention_mask=mask).last_hidden_state
        lengths = mask.sum(dim=1).tolist()
        return AdvancedPromptEmbeds(text_embeds=[
            states[i, :n].to(self.device, self.dtype).clone() for i, n in enumerate(lengths)])

    @property
    def text_embedding_space_version(self) -> str:
        return "wan-1"

    @property
    def latent_space_version(self) -> str:
        return "wan-1"

    # ---- 3. train step -------------------------------------------------------------
    def flow_shift(self) -> FlowShift:
        """The sampler's fixed shift: UniPC's `flow_shift`, or a FlowMatch `shift`."""
        cfg = self.noise_scheduler.config
        shift = cfg.get("flow_shift") or cfg.get("shift") or 1.0
        return FlowShift(shift=float(shift))

    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        return FlowMatchSchedule(settings, self.flow_shift(), image_tokens(2))

    def condition_noisy_latents(self, noisy_latents: torch.Tensor, batch: Any) -> torch.Tensor:
        return noisy_latents

    def image_embeds_for(self, batch: Any) -> torch.Tensor | None:
        """2.1 i2v: CLIP embeddings of the batch's first frames; None otherwise."""
        return None

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        x = latent_model_input.to(self.device, self.dtype)
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(x.shape[0]) if t.numel() == 1 else t
        context = padded_context(text_embeddings.expand_to_batch(x.shape[0]), self.device,
                                 self.dtype)
        image = self.image_embeds_for(batch) if batch is not None else None
        return self.denoise(x, t, context, image)

    def denoise(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                image: torch.Tensor | None) -> torch.Tensor:
        return run_transformer(self.model, x, t, context, image)

    # ---- 4. previews ---------------------------------------------------------------
    def fresh_scheduler(self) -> Any:
        """A new sampler from the model's scheduler config (previews keep no state)."""
        return type(self.noise_scheduler).from_config(self.noise_scheduler.config)

    def get_generation_pipeline(self) -> Any:
        from diffusers import WanPipeline

        pipeline = WanPipeline(tokenizer=None, text_encoder=None, vae=self.vae,
                               scheduler=self.fresh_scheduler(),
                               **self.pipeline_transformers())
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def pipeline_transformers(self) -> dict[str, Any]:
        return {"transformer": self.model, "transformer_2": None, "boundary_ratio": None}

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        with self.preview_devices():
            return run_pipeline(pipeline, gen_config, conditional_embeds,
                                unconditional_embeds, generator, self.device, self.dtype,
                                **self.preview_inputs(gen_config))

    def preview_inputs(self, gen_config: GenerateImageConfig) -> dict[str, Any]:
        return {}

    @contextlib.contextmanager
    def preview_devices(self):
        with self.on_device(self.vae):
            yield

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return to_wan_keys(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return from_wan_keys(state_dict)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        """VAE 8 x patch 2."""
        return self.vae_scale_factor * self.transformers[0].config.patch_size[-1]


class FirstFrameConditioned:
    """The i2v half of a Wan model (mixed in before Wan21Model / Wan22Model): the first
    frame as condition channels, plus CLIP image embeddings when the transformer takes
    them (2.1; 2.2 14B i2v has no image encoder)."""

    image_encoder: torch.nn.Module | None = None
    image_processor: Any = None
    _first: tuple[Any, torch.Tensor] | None = None
    _warned_grey = False

    def load_extras(self, name: str) -> None:
        self.image_encoder = self.image_processor = None
        if self.transformers[0].config.image_dim is None:
            return
        import transformers
        from transformers import CLIPVisionModel

        # The PIL processor: the default one wants torchvision, which the trainer lacks.
        processor_cls = getattr(transformers, "CLIPImageProcessorPil",
                                transformers.CLIPImageProcessor)
        encoder = load_part(CLIPVisionModel, name, "image_encoder", self.arch,
                            dtype=self.dtype)
        freeze(encoder)
        self.place_loaded([], idle=[encoder])
        self.image_encoder = encoder
        self.image_processor = load_part(processor_cls, name, "image_processor", self.arch)

    def first_frames(self, batch: Any) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1]: the batch's first frames (its pixels when the batch
        carries them, else the first latent frame decoded: the causal VAE encodes frame 0
        on its own). Remembered for the batch, since both hooks need it."""
        if self._first is not None and self._first[0] is batch:
            return self._first[1]
        if getattr(batch, "tensor", None) is not None:
            frames = as_video(batch.tensor)[:, :, 0]
        elif getattr(batch, "latents", None) is not None:
            frames = self.decode_latents(batch.latents[:, :, :1])[:, :, 0]
        else:
            raise ValueError(f"{self.arch} needs the batch's pixels or latents for its "
                             "first-frame condition")
        frames = frames.to(self.device, torch.float32)
        self._first = (batch, frames)
        return frames

    def condition_latents(self, first: torch.Tensor, frames: int, height: int,
                          width: int) -> torch.Tensor:
        """[mask (4 ch) | VAE latents of (first frame, zeros)] for `frames` latent
        frames, as WanImageToVideoPipeline.prepare_latents builds it."""
        b = first.shape[0]
        pixel_frames = (frames - 1) * 4 + 1
        scale = self.vae_scale_factor
        first = F.interpolate(first, size=(height * scale, width * scale), mode="bilinear",
                              align_corners=False)
        video = torch.cat([first[:, :, None], first.new_zeros(
            b, 3, pixel_frames - 1, height * scale, width * scale)], dim=2)
        with torch.no_grad(), self.on_device(self.vae):
            z = self.vae.encode(video.to(self.device, torch.float32)).latent_dist.mode()
        mean, std = self._latent_stats(z)
        z = (z - mean) / std
        mask = torch.zeros(b, MASK_CHANNELS, frames, height, width, device=z.device)
        mask[:, :, 0] = 1.0
        return torch.cat([mask, z], dim=1).to(self.dtype)

    def condition_noisy_latents(self, noisy_latents: torch.Tensor, batch: Any) -> torch.Tensor:
        _, _, f, h, w = noisy_latents.shape
        cond = self.condition_latents(self.first_frames(batch), f, h, w)
        return torch.cat([noisy_latents, cond.to(noisy_latents.device)], dim=1)

    def image_embeds_for(self, batch: Any) -> torch.Tensor | None:
        if self.image_encoder is None:
            return None
        return self.clip_embeds(self.first_frames(batch))

    def clip_embeds(self, frames: torch.Tensor) -> torch.Tensor:
        """CLIP's penultimate hidden states of frames in [-1, 1] (resized bilinearly to
        the processor's crop size and normalised as it does)."""
        proc = self.image_processor
        crop = proc.crop_size
        x = ((frames.float() + 1) / 2).clamp(0, 1)
        x = F.interpolate(x, size=(crop["height"], crop["width"]), mode="bilinear",
                          align_corners=False)
        mean = torch.tensor(proc.image_mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(proc.image_std, device=x.device).view(1, 3, 1, 1)
        enc = self.image_encoder
        with torch.no_grad(), self.on_device(enc):
            out = enc(pixel_values=((x - mean) / std).to(self.device, self.dtype),
                      output_hidden_states=True)
        return out.hidden_states[-2].to(self.device, self.dtype)

    def get_generation_pipeline(self) -> Any:
        from diffusers import WanImageToVideoPipeline

        pipeline = WanImageToVideoPipeline(
            tokenizer=None, text_encoder=None, vae=self.vae,
            scheduler=self.fresh_scheduler(),
            image_encoder=self.image_encoder, image_processor=self.image_processor,
            **self.pipeline_transformers())
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def preview_inputs(self, gen_config: GenerateImageConfig) -> dict[str, Any]:
        return {"image": preview_first_frame(gen_config, self._warn_grey)}

    def _warn_grey(self) -> None:
        if not self._warned_grey:
            self._warned_grey = True
            print(f"warning: {self.arch} previews condition on a first frame: a sample "
                  "without ctrl_img uses a mid-grey one", file=sys.stderr)

    @contextlib.contextmanager
    def preview_devices(self):
        with super().preview_devices(), self.on_device(self.image_encoder):
            yield


class Wan21I2VModel(FirstFrameConditioned, Wan21Model):
    arch = "wan21_i2v"
    tiny_variant = WAN21_I2V


# ---- shared helpers (the trainer and the interop tests call the same ones) ------------
def padded_context(embeds: AdvancedPromptEmbeds, device: torch.device, dtype: torch.dtype
                   ) -> torch.Tensor:
    """(B, 512, D): each prompt's tokens then zeros, as WanPipeline pads them."""
    items = [t.to(device, dtype) for t in embeds.text_embeds]
    out = torch.zeros(len(items), TEXT_LEN, items[0].shape[-1], device=device, dtype=dtype)
    for i, t in enumerate(items):
        n = min(t.shape[0], TEXT_LEN)
        out[i, :n] = t[:n]
    return out


def run_transformer(transformer: torch.nn.Module, x: torch.Tensor, t: torch.Tensor,
                    context: torch.Tensor, image: torch.Tensor | None) -> torch.Tensor:
    kwargs = {} if image is None else {"encoder_hidden_states_image": image}
    return transformer(hidden_states=x, timestep=t.to(x.dtype), encoder_hidden_states=context,
                       return_dict=False, **kwargs)[0]


def preview_first_frame(gen_config: GenerateImageConfig, on_grey: Any = None) -> Image.Image:
    """The i2v condition of a preview: `ctrl_img` resized to the sample size (a mid-grey
    frame when the sample names none)."""
    size = (gen_config.width, gen_config.height)
    if not gen_config.ctrl_img:
        if on_grey is not None:
            on_grey()
        return Image.new("RGB", size, (128, 128, 128))
    try:
        with Image.open(gen_config.ctrl_img) as img:
            return img.convert("RGB").resize(size, Image.Resampling.LANCZOS)
    except OSError as exc:
        raise ModelLoadError(f"sample ctrl_img {gen_config.ctrl_img}: cannot read it "
                             f"({exc})") from None


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype,
                 **inputs: Any) -> Any:
    """One preview from diffusers' Wan pipeline called with embeds only: the list of PIL
    frames, or one image when num_frames == 1. Shared by the trainer's previews and the
    interop tests (the same call on a pipeline that loaded the LoRA through diffusers)."""
    kwargs: dict[str, Any] = {}
    if gen_config.guidance_scale > 1.0:
        kwargs["negative_prompt_embeds"] = padded_context(unconditional, device, dtype)
    frames = pipeline(prompt_embeds=padded_context(conditional, device, dtype),
                      guidance_scale=gen_config.guidance_scale, height=gen_config.height,
                      width=gen_config.width, num_frames=max(1, int(gen_config.num_frames)),
                      num_inference_steps=gen_config.sample_steps, generator=generator,
                      output_type="pil", **inputs, **kwargs).frames[0]
    return list(frames) if gen_config.num_frames > 1 else frames[0]
