"""FluxKontextModel: FLUX.1 Kontext dev (arch `flux_kontext`), an edit model on the Flux
transformer. Everything Flux does holds (see aitk.models.flux.model); Kontext adds a
reference image, as diffusers' FluxKontextPipeline feeds it:

- The control image (`batch.control_tensor`, (B, 3, H, W) in [0, 1]) is VAE-encoded and
  normalised like the target (`(z - shift) * scale`), packed in 2x2 patches and appended
  after the noisy image tokens; its ids carry 1 on the first axis (the noisy tokens 0),
  so the transformer tells the two apart while both share the same 2-D positions.
- `condition_noisy_latents` returns noisy and control latents stacked on the channel
  axis, (B, 2C, h, w): the control is resized to the bucket first (the data layer
  already gives it the bucket's size), so the pair always has the same sides.
  `get_noise_prediction` packs each half, runs the joined sequence and keeps only the
  noisy tokens' prediction. A batch without control trains as plain Flux.
- Previews: `ctrl_img` (a path) is read, resized to the sample's width x height,
  encoded like a training control and given to FluxKontextPipeline as its `image`
  latents (no resize to Kontext's preferred resolutions, `max_area` = the sample's
  area, so the sample size is kept); the final latents are decoded in float32.
- LoRA files: `transformer.` + diffusers names with `.alpha`, as Flux (what
  `FluxKontextPipeline.load_lora_weights` and ComfyUI read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aitk.errors import ModelError
from aitk.models.base import GenerateImageConfig
from aitk.models.flux.model import FluxModel
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

REFERENCE_ID = 1.0  # first id axis of the reference tokens (FluxKontextPipeline's value)


class FluxKontextModel(FluxModel):
    arch = "flux_kontext"
    use_old_lokr_format = False
    pipeline_class = "FluxKontextPipeline"

    @property
    def latent_channels(self) -> int:
        return int(self.model.config.in_channels) // 4

    # ---- 3. train step -------------------------------------------------------------
    def encode_control(self, control: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Control pixels in [0, 1] -> latents at `height` x `width` pixels, normalised
        like the target."""
        control = control.to(self.device, torch.float32)
        if tuple(control.shape[-2:]) != (height, width):
            control = torch.nn.functional.interpolate(control, size=(height, width),
                                                      mode="bilinear", antialias=True,
                                                      align_corners=False)
        return self.encode_images(control * 2 - 1)

    def condition_noisy_latents(self, noisy_latents: torch.Tensor, batch: Any
                                ) -> torch.Tensor:
        control = getattr(batch, "control_tensor", None)
        if control is None:
            return noisy_latents
        _, _, h, w = noisy_latents.shape
        f = self.vae_scale_factor
        reference = self.encode_control(control, h * f, w * f)
        return torch.cat([noisy_latents, reference.to(noisy_latents.dtype)], dim=1)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        """(B, C, h, w): plain Flux; (B, 2C, h, w): noisy latents then their reference,
        joined as one token sequence; the prediction is the noisy tokens' part."""
        from diffusers import FluxPipeline

        c = self.latent_channels
        channels = latent_model_input.shape[1]
        if channels == c:
            return super().get_noise_prediction(latent_model_input, timestep, text_embeddings)
        if channels != 2 * c:
            raise ValueError(f"Kontext expects {c} latent channels, or {2 * c} with the "
                             f"reference stacked on them; got {channels}")
        noisy, reference = latent_model_input[:, :c], latent_model_input[:, c:]
        tokens, ids = self.pack_with_ids(noisy)
        ref_tokens, ref_ids = self.pack_with_ids(reference)
        ref_ids = ref_ids.clone()
        ref_ids[:, 0] = REFERENCE_ID
        out = self.predict_packed(torch.cat([tokens, ref_tokens], dim=1),
                                  torch.cat([ids, ref_ids], dim=0), timestep,
                                  text_embeddings)
        out = out[:, :tokens.shape[1]]
        _, _, h, w = noisy.shape
        f = self.vae_scale_factor
        return FluxPipeline._unpack_latents(out, h * f, w * f, f)

    # ---- 4. previews ---------------------------------------------------------------
    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Any:
        """Embedded guidance as Flux dev; `ctrl_img` is the image to edit (none: the
        pipeline generates from the prompt alone)."""
        self.check_sample_size(gen_config, "Flux Kontext: VAE 8 x packing 2")
        width, height = gen_config.width, gen_config.height
        reference = (self.encode_preview_control(pipeline, gen_config)
                     if gen_config.ctrl_img else None)
        embeds = conditional_embeds.to(self.device, self.dtype)
        text, _ = embeds.pad("text_embeds")
        pooled, _ = embeds.pad("pooled_embeds")
        latents = self._start_latents(gen_config, generator)
        packed = pipeline(image=reference, prompt_embeds=text,
                          pooled_prompt_embeds=pooled[:, 0], latents=latents, width=width,
                          height=height, num_inference_steps=gen_config.sample_steps,
                          guidance_scale=gen_config.guidance_scale, generator=generator,
                          max_area=width * height, _auto_resize=False,
                          output_type="latent").images
        return self.packed_to_image(pipeline, packed, gen_config)

    def encode_preview_control(self, pipeline: Any, gen_config: GenerateImageConfig
                               ) -> torch.Tensor:
        """`ctrl_img` at the sample size, pre-processed as the pipeline does and encoded
        by `encode_images` (the float32 VAE); the pipeline takes these latents as is."""
        image = load_control_image(gen_config.ctrl_img, gen_config.width, gen_config.height)
        pixels = pipeline.image_processor.preprocess(image, gen_config.height,
                                                     gen_config.width)
        return self.encode_images(pixels)


def load_control_image(path: str, width: int, height: int) -> Any:
    """The preview's control image as RGB at the sample's size; one-line error if unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(Path(path).expanduser()) as img:
            rgb = img.convert("RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise ModelError(f"sample ctrl_img {path} cannot be read: {exc}") from None
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
    return rgb
