"""LTX-2 (Lightricks) on diffusers: `ltx2`, one transformer with a video stream and an
audio stream that attend to each other, trained on video and, with a dataset's
`do_audio`, on the clips' sound.

`name_or_path`: a diffusers folder or hub id (Lightricks/LTX-2) with

    transformer/   LTX2VideoTransformer3DModel (patch 1: one token per latent cell)
    vae/           AutoencoderKLLTX2Video: 32x space, 8x time (F = 8k + 1 frames), 128 ch
    audio_vae/, vocoder/   mel latents and their waveform (the previews' soundtrack)
    connectors/    LTX2TextConnectors: the stacked Gemma states -> each stream's tokens
    text_encoder/  Gemma3ForConditionalGeneration (Gemma 3 12B), tokenizer/ Gemma's
    scheduler/     FlowMatchEulerDiscreteScheduler, dynamic exponential shift

Conventions at this arch's edges (aitk.models.base):
- Pixels (B, 3, F, H, W) in [-1, 1], an image is a 1-frame clip; latents (B, 128,
  (F - 1) / 8 + 1, H / 32, W / 32), the posterior mode normalised per channel with the
  VAE's `latents_mean` / `latents_std` (as LTX2Pipeline).
- Prompts: every Gemma hidden state (the embeddings and each layer) of the real tokens
  stacked per token, (L, D * (layers + 1)), each prompt encoded alone so no padding
  touches it; at the model call they are left-padded with zeros to 1024 tokens with a
  mask, as upstream pads them (the connectors' registers fill the padding).
- Training: flow matching, target noise - clean, the scheduler's dynamic shift over
  the video tokens for `timestep_type: shift`. Each step runs the connectors (frozen,
  no gradients) on the prompt, then the transformer on the packed video tokens and an
  audio stream of the clip's duration at 24 fps (`audio_frames`). Its noise is drawn
  from a generator keyed by the micro-step (`begin_micro_step`), so a resumed run draws
  the same. A clip with sound (`do_audio`, aitk.data.audio) feeds its audio latents
  noised at the video's sigma, and the stream's flow-matching loss (noise - clean, mean
  squared error over the clips that have sound) times `train.audio_loss_multiplier` is
  the step's `side_loss`; a clip without sound gets pure noise at the video's timestep
  and its audio prediction is unused (upstream's path for a clip without audio).
- Audio latents (`encode_audio`): the clip's PCM at the audio VAE's sample rate and
  channels -> log-mel spectrogram (n_fft 1024, the VAE's hop and mel bins: upstream's
  and the pipeline's parameters) -> the VAE posterior's mode, packed (L, C * mel/4) and
  normalised with the VAE's `latents_mean` / `latents_std` as LTX2Pipeline does, cut or
  zero-padded to `audio_frames` so it matches the clip's video length.
- LoRA files: `diffusion_model.` + the transformer's module names (Lightricks' names,
  which are diffusers' for every adapted Linear), the layout ComfyUI's LTXAV loader and
  diffusers' LTX2Pipeline.load_lora_weights read. diffusers refuses a file with
  `.alpha` keys, so each LoRA's scale alpha / rank is folded into its up weights and no
  alpha is written (both loaders then apply scale 1: the same delta).
- Previews: LTX2Pipeline with embeds only, classifier-free guidance only (no
  spatio-temporal or modality guidance): the frames with the soundtrack the audio VAE
  and vocoder make (`VideoWithSound`, which aitk.run.sampling also writes as an mp4).
  A sample with `ctrl_img` is image to video (LTX2ImageToVideoPipeline: the picture,
  resized to the sample size, is the first latent frame), as upstream previews it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.diffusion.timesteps import FlowShift
from aitk.errors import ModelLoadError
from aitk.models.base import BaseModel, GenerateImageConfig, VideoWithSound
from aitk.models.loading import freeze, load_part, load_scheduler
from aitk.models.ltx2.lora_keys import from_ltx2_keys, to_ltx2_keys
from aitk.models.ltx2.tiny import TEXT_LEN, build_tiny_ltx2
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.wan21.model import preview_first_frame

FRAME_RATE = 24.0  # LTX-2's native rate: the video RoPE's time axis and the audio length
N_FFT = 1024  # the mel spectrogram's window (upstream's; the VAE config does not say)
# Kept in the float dtype by quantization: the embedders, modulation and output heads.
TRANSFORMER_QUANT_EXCLUDE = ("proj_in", "audio_proj_in", "*caption_projection*",
                             "*time_embed*", "av_cross_attn*", "proj_out", "audio_proj_out")


class LTX2Model(BaseModel):
    arch = "ltx2"
    use_old_lokr_format = False
    is_video: ClassVar[bool] = True
    lora_block_prefixes = ("transformer_blocks.",)
    _micro_step = 0
    # The last training prediction's audio stream: (prediction, target, has sound (B,)).
    _audio_pass: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        build_tiny_ltx2(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import (
            AutoencoderKLLTX2Audio,
            AutoencoderKLLTX2Video,
            FlowMatchEulerDiscreteScheduler,
            LTX2VideoTransformer3DModel,
        )
        from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
        from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
        from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

        name = str(self.model_config.name_or_path)
        transformer = self.load_denoiser(LTX2VideoTransformer3DModel, name, "transformer",
                                         TRANSFORMER_QUANT_EXCLUDE, dtype=self.dtype)
        freeze(transformer)
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.model = transformer.to(self.device)
        text_encoder = load_part(Gemma3ForConditionalGeneration, name, "text_encoder",
                                 self.arch, dtype=self.dtype)
        self.tokenizer = load_part(AutoTokenizer, name, "tokenizer", self.arch)
        connectors = load_part(LTX2TextConnectors, name, "connectors", self.arch,
                               dtype=self.dtype)
        # The VAEs stay float32: encode/decode quality matters more than their size.
        vae = load_part(AutoencoderKLLTX2Video, name, "vae", self.arch, dtype=torch.float32)
        audio_vae = load_part(AutoencoderKLLTX2Audio, name, "audio_vae", self.arch,
                              dtype=torch.float32)
        vocoder = load_part(LTX2Vocoder, name, "vocoder", self.arch, dtype=torch.float32)
        self.noise_scheduler = load_scheduler(name, self.arch, FlowMatchEulerDiscreteScheduler)
        freeze(text_encoder, connectors, vae, audio_vae, vocoder)
        # The connectors run every step; the rest only while caching or previewing.
        self.place_loaded([connectors], idle=[text_encoder, vae, audio_vae, vocoder])
        self.text_encoder, self.connectors, self.vae = text_encoder, connectors, vae
        self.audio_vae, self.vocoder = audio_vae, vocoder
        self.quantize_text_encoder(text_encoder)

    # ---- 2. encoders ---------------------------------------------------------------
    def _latent_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        return (self.vae.latents_mean.view(shape).to(like.device, torch.float32),
                self.vae.latents_std.view(shape).to(like.device, torch.float32))

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) or (B, 3, F, H, W) in [-1, 1] -> (B, C, (F-1)/8+1, H/32, W/32):
        the posterior mode, normalised per channel."""
        x = images[:, :, None] if images.ndim == 4 else images
        with torch.no_grad(), self.on_device(self.vae):
            z = self.vae.encode(x.to(self.device, torch.float32)).latent_dist.mode()
        mean, std = self._latent_stats(z)
        return ((z - mean) / std).to(self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.to(self.device, torch.float32)
        mean, std = self._latent_stats(z)
        with torch.no_grad(), self.on_device(self.vae):
            return self.vae.decode(z * std + mean).sample.clamp(-1, 1)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D * (layers + 1)) tensor per prompt: every Gemma hidden state of its
        real tokens, stacked per token as LTX2Pipeline stacks them."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        te, out = self.text_encoder, []
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            for prompt in prompts:
                tokens = self.tokenizer([prompt.strip()], max_length=TEXT_LEN, truncation=True,
                                        add_special_tokens=True, return_tensors="pt")
                states = te(input_ids=tokens.input_ids.to(where),
                            attention_mask=tokens.attention_mask.to(where),
                            output_hidden_states=True).hidden_states
                out.append(torch.stack(states, dim=-1).flatten(2, 3)[0]
                           .to(self.device, self.dtype).clone())
        return AdvancedPromptEmbeds(text_embeds=out)

    @property
    def text_embedding_space_version(self) -> str:
        return "ltx2-gemma3-stacked"

    @property
    def latent_space_version(self) -> str:
        return "ltx2-video-vae"

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        shift = FlowShift.from_scheduler_config(self.noise_scheduler.config)
        return FlowMatchSchedule(settings, shift, image_tokens(1))

    def begin_micro_step(self, index: int) -> None:
        self._micro_step = index

    def audio_frames(self, latent_frames: int, fps: float = FRAME_RATE) -> int:
        """The audio latent length of a clip of `latent_frames` video latents (LTX2Pipeline's
        rule: the clip's duration x the audio latents per second)."""
        pixel_frames = (latent_frames - 1) * self.vae.temporal_compression_ratio + 1
        cfg, ratio = self.audio_vae.config, self.audio_vae.temporal_compression_ratio
        per_second = cfg.sample_rate / cfg.mel_hop_length / ratio
        return round(pixel_frames / fps * per_second)

    # ---- sound ----------------------------------------------------------------------
    def audio_format(self) -> tuple[int, int]:
        cfg = self.audio_vae.config
        return int(cfg.sample_rate), int(cfg.in_channels)

    def encode_audio(self, pcm: torch.Tensor, num_frames: int) -> torch.Tensor:
        """(C, N) PCM of a clip of `num_frames` frames -> (audio_frames, C' * mel/4)
        normalised audio latents (see the module docstring)."""
        from diffusers import LTX2Pipeline

        from aitk.data.audio import log_mel

        cfg = self.audio_vae.config
        mel = log_mel(pcm.float(), int(cfg.sample_rate), int(cfg.mel_hop_length),
                      int(cfg.mel_bins), N_FFT)
        with torch.no_grad(), self.on_device(self.audio_vae):
            z = self.audio_vae.encode(mel[None].to(self.device)).latent_dist.mode()
        packed = LTX2Pipeline._normalize_audio_latents(
            LTX2Pipeline._pack_audio_latents(z.float()),
            self.audio_vae.latents_mean.float(), self.audio_vae.latents_std.float())[0]
        latent_frames = (num_frames - 1) // self.vae.temporal_compression_ratio + 1
        want = self.audio_frames(latent_frames)
        out = packed.new_zeros(want, packed.shape[1])
        out[:min(want, packed.shape[0])] = packed[:want]
        return out.cpu()

    def audio_stream(self, batch: Any, b: int, frames: int, t: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(the audio stream's input, its target or None, has sound (B,) or None): the
        batch's audio latents noised at sigma t / 1000 with the micro-step's noise;
        pure noise for a clip without sound."""
        noise = self.silent_audio(b, frames)
        sounds = getattr(batch, "audio_latents", None)
        if not sounds or all(s is None for s in sounds):
            return noise, None, None
        clean = torch.stack([noise.new_zeros(noise.shape[1:]) if s is None
                             else s.to(noise.device, noise.dtype) for s in sounds])
        has = torch.tensor([s is not None for s in sounds], device=noise.device)
        s = (t.float() / 1000.0).view(-1, 1, 1).to(noise.device)
        noisy = torch.where(has.view(-1, 1, 1), (1 - s) * clean.float() + s * noise.float(),
                            noise.float()).to(noise.dtype)
        return noisy, (noise.float() - clean.float()), has

    def side_loss(self) -> torch.Tensor | None:
        """The audio stream's loss of the last prediction: mean squared error over the
        clips with sound, times `train.audio_loss_multiplier`."""
        taken, self._audio_pass = self._audio_pass, None
        if taken is None:
            return None
        pred, target, has = taken
        per_item = (pred.float() - target.to(pred.device)).pow(2).flatten(1).mean(1)
        weight = has.to(per_item.device, torch.float32)
        multiplier = float(getattr(getattr(self, "train_config", None),
                                   "audio_loss_multiplier", 1.0))
        return (per_item * weight).sum() / weight.sum() * multiplier

    def silent_audio(self, batch: int, frames: int) -> torch.Tensor:
        """The audio stream of a clip without a soundtrack: packed noise latents
        (B, frames, C * mel bins), drawn from a generator keyed by the micro-step."""
        cfg = self.audio_vae.config
        seed = int(getattr(getattr(self, "train_config", None), "seed", 0) or 0)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + self._micro_step)
        bins = cfg.mel_bins // self.audio_vae.mel_compression_ratio
        noise = torch.randn(batch, frames, cfg.latent_channels * bins, generator=gen)
        return noise.to(self.device, self.dtype)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        from diffusers import LTX2Pipeline

        x = latent_model_input.to(self.device, self.dtype)
        b, _, f, h, w = x.shape
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        embeds, mask = padded_prompt(text_embeddings.expand_to_batch(b), self.device, self.dtype)
        with torch.no_grad():
            video_ctx, audio_ctx, ctx_mask = self.connectors(embeds, mask, padding_side="left")
        patch, patch_t = self.model.config.patch_size, self.model.config.patch_size_t
        audio_frames = self.audio_frames(f)
        audio_in, audio_target, has_sound = self.audio_stream(batch, b, audio_frames, t)
        pred, audio_pred = self.model(
            hidden_states=LTX2Pipeline._pack_latents(x, patch, patch_t),
            audio_hidden_states=audio_in,
            encoder_hidden_states=video_ctx, audio_encoder_hidden_states=audio_ctx,
            timestep=t.to(x.dtype), audio_timestep=t.to(x.dtype), sigma=t.to(x.dtype),
            encoder_attention_mask=ctx_mask, audio_encoder_attention_mask=ctx_mask,
            num_frames=f, height=h, width=w, fps=FRAME_RATE, audio_num_frames=audio_frames,
            use_cross_timestep=False, return_dict=False)
        self._audio_pass = (None if audio_target is None or has_sound is None
                            else (audio_pred, audio_target, has_sound))
        return LTX2Pipeline._unpack_latents(pred, f, h, w, patch, patch_t)

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import LTX2Pipeline

        pipeline = LTX2Pipeline(
            scheduler=type(self.noise_scheduler).from_config(self.noise_scheduler.config),
            vae=self.vae, audio_vae=self.audio_vae, text_encoder=None, tokenizer=None,
            connectors=self.connectors, transformer=self.model, vocoder=self.vocoder)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def first_frame_pipeline(self, pipeline: Any) -> Any:
        """Image to video (upstream's previews with `ctrl_img`): LTX2ImageToVideoPipeline
        on the same parts, which holds the picture's latents as the first latent frame."""
        from diffusers import LTX2ImageToVideoPipeline

        i2v = LTX2ImageToVideoPipeline(
            scheduler=pipeline.scheduler, vae=self.vae, audio_vae=self.audio_vae,
            text_encoder=None, tokenizer=None, connectors=self.connectors,
            transformer=self.model, vocoder=self.vocoder)
        i2v.set_progress_bar_config(disable=True)
        return i2v

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        self.check_sample_size(gen_config, "LTX-2's VAE compresses 32x")
        inputs: dict[str, Any] = {}
        if gen_config.ctrl_img:
            pipeline = self.first_frame_pipeline(pipeline)
            inputs["image"] = preview_first_frame(gen_config)
        with self.preview_devices():
            return run_pipeline(pipeline, gen_config, conditional_embeds,
                                unconditional_embeds, generator, self.device, self.dtype,
                                **inputs)

    @contextlib.contextmanager
    def preview_devices(self) -> Iterator[None]:
        with self.on_device(self.vae), self.on_device(self.audio_vae), \
                self.on_device(self.vocoder):
            yield

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return to_ltx2_keys(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return from_ltx2_keys(state_dict)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        """VAE 32 x patch 1."""
        return self.vae.spatial_compression_ratio * self.model.config.patch_size


# ---- shared helpers (the trainer and the interop tests call the same ones) ------------
def padded_prompt(embeds: AdvancedPromptEmbeds, device: torch.device, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 1024, D) and its mask: each prompt's tokens at the end, zeros before them (left
    padding, as Gemma's tokenizer pads for LTX-2)."""
    items = [t.to(device, dtype) for t in embeds.text_embeds]
    out = torch.zeros(len(items), TEXT_LEN, items[0].shape[-1], device=device, dtype=dtype)
    mask = torch.zeros(len(items), TEXT_LEN, device=device, dtype=torch.long)
    for i, t in enumerate(items):
        n = min(t.shape[0], TEXT_LEN)
        out[i, TEXT_LEN - n:] = t[:n]
        mask[i, TEXT_LEN - n:] = 1
    return out, mask


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype,
                 **inputs: Any) -> Any:
    """One preview from diffusers' LTX2Pipeline (or LTX2ImageToVideoPipeline, with
    `image=`) called with embeds only, plain classifier-free guidance (LTX-2.0's
    behaviour: no cross-modal timestep), at the sample's fps: the list of PIL frames, or
    one image when num_frames == 1; a clip comes with the pipeline's soundtrack
    (VideoWithSound: the vocoder's waveform at its output rate)."""
    embeds, mask = padded_prompt(conditional, device, dtype)
    neg, neg_mask = padded_prompt(unconditional, device, dtype)
    out = pipeline(
        prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt_embeds=neg,
        negative_prompt_attention_mask=neg_mask, height=gen_config.height,
        width=gen_config.width, num_frames=max(1, int(gen_config.num_frames)),
        frame_rate=float(gen_config.fps or FRAME_RATE),
        num_inference_steps=gen_config.sample_steps, guidance_scale=gen_config.guidance_scale,
        audio_guidance_scale=gen_config.guidance_scale, guidance_rescale=0.0,
        audio_guidance_rescale=0.0, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
        audio_modality_scale=1.0, spatio_temporal_guidance_blocks=None,
        use_cross_timestep=False, generator=generator, output_type="pil", **inputs)
    frames = out.frames[0]
    if gen_config.num_frames <= 1:
        return frames[0]
    rate = int(pipeline.vocoder.config.output_sampling_rate)
    return VideoWithSound(frames, out.audio[0].float().cpu().numpy(), rate)
