"""The `qwen_image_edit` and `qwen_image_edit_plus` archs (Qwen-Image-Edit, -2509/2511),
on aitk.models.qwen_image and diffusers' QwenImageEditPipeline / QwenImageEditPlusPipeline.

`name_or_path`: a diffusers folder or hub id (Qwen/Qwen-Image-Edit, Qwen/Qwen-Image-Edit-
2509) with qwen_image's parts plus `processor/`, of which only
`preprocessor_config.json` is read (see vision.py: no torchvision).

What differs from qwen_image (everything else is inherited: VAE latents and their
normalisation, 2x2 packing, the timestep shift, LoRA layout, quantization, low_vram):

- Control images. An edit pair is (target image, control image(s)); the dataset gives
  the controls as `batch.control_tensor_list` in [0, 1] (aitk.data.controls). As in the
  pipelines, each control is VAE-encoded, normalised and packed, and its tokens are
  appended after the noisy image's tokens; `img_shapes` lists the noisy image, then each
  control (its own RoPE frame). `condition_noisy_latents` returns that packed sequence
  (B, N_noisy + N_controls, 4C); `get_noise_prediction` reads the sizes back from the
  batch and slices the prediction to the noisy tokens before unpacking.
  - qwen_image_edit: one control, encoded at the training image's size (upstream's
    training; the pipeline encodes it at about 1 MP at inference).
  - qwen_image_edit_plus: up to 3 controls, each encoded at about 1 MP (the pipeline's
    VAE_IMAGE_SIZE), or at the training image's area with `model_kwargs:
    {match_target_res: true}` (upstream's knob; cheaper, the tiny configs use it; the
    previews then size references to the preview's area too).
- Text. The prompt goes through the edit template with the control image(s) in it, so
  the text encoder's vision tower is kept and the prompt embeddings depend on the control
  (`encode_control_in_text_embeddings`: the text-embed cache keys include the control
  images' content, aitk.data.controls). Edit: `<|vision_start|><|image_pad|>
  <|vision_end|>` before the prompt, the image at about 1 MP; plus: `Picture i: ...` per
  control, each at about 384 x 384 (CONDITION_IMAGE_SIZE). The hidden states of the
  template's system part are dropped (diffusers' start index 64 for the real tokenizer;
  counted here from the tokenizer); the image tokens stay in the embeddings.
- Previews: diffusers' own edit pipeline, given the embeds and the sample's `ctrl_img`
  (plus: `ctrl_img`/`ctrl_img_1`, `ctrl_img_2`, `ctrl_img_3`); every preview of an edit
  arch needs one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from PIL import Image

from aitk.data.controls import load_sample_controls, open_sample_control, prompt_key
from aitk.errors import ModelError, ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.loading import load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.models.qwen_image.model import QwenImageModel, run_pipeline
from aitk.models.qwen_image_edit.vision import VisionTextInputs, resized, to_pil

EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should "
    "alter or modify the image. Generate a new image that meets the user's requirements "
    "while maintaining consistency with the original input where appropriate.<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
IMAGE_SLOT = "<|vision_start|><|image_pad|><|vision_end|>"
PICTURE_SLOT = "Picture {}: " + IMAGE_SLOT
ONE_MEGAPIXEL = 1024 * 1024  # the pipelines' VAE size for control images
CONDITION_IMAGE_SIZE = 384 * 384  # edit_plus: each image the text encoder sees


class QwenImageEditModel(QwenImageModel):
    arch = "qwen_image_edit"
    use_old_lokr_format = False
    keep_vision_tower = True
    encode_control_in_text_embeddings = True
    pipeline_name: ClassVar[str] = "QwenImageEditPipeline"
    max_controls: ClassVar[int] = 1
    condition_area: ClassVar[int] = ONE_MEGAPIXEL  # the text encoder's view of a control

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.qwen_image_edit.tiny import build_tiny_qwen_image_edit

        build_tiny_qwen_image_edit(target, seed=seed, pipeline=cls.pipeline_name)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        super().load_model()
        self.template_drop = len(self.tokenizer(EDIT_TEMPLATE.split("{}")[0]).input_ids)
        self.processor = VisionTextInputs(self.tokenizer, self._image_processor())

    def _image_processor(self) -> Any:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        root = Path(str(self.model_config.name_or_path)).expanduser()
        if root.is_dir() and not (root / "processor").is_dir():
            return Qwen2VLImageProcessorPil()  # Qwen2.5-VL's own defaults
        return load_part(Qwen2VLImageProcessorPil, str(self.model_config.name_or_path),
                         "processor", self.arch)

    # ---- 2. text with images -------------------------------------------------------
    def image_slots(self, count: int) -> str:
        return IMAGE_SLOT if count else ""

    def condition_images(self, controls: Sequence[torch.Tensor]) -> list[Image.Image]:
        """One item's controls ((3, H, W) in [0, 1]) as the text encoder sees them."""
        return [resized(to_pil(c), self.condition_area) for c in controls[:self.max_controls]]

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D) tensor per prompt, from the edit template with prompt i's control
        images (`control_images`: one (B, 3, H, W) tensor in [0, 1] per control)."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        controls = list(control_images or [])
        per_prompt = [self.condition_images([c[i] for c in controls])
                      for i in range(len(prompts))]
        texts = [EDIT_TEMPLATE.format(self.image_slots(len(imgs)) + p)
                 for p, imgs in zip(prompts, per_prompt, strict=True)]
        flat = [img for imgs in per_prompt for img in imgs]
        inputs = self.processor(text=texts, images=flat or None, padding=True)
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            kwargs = {k: v.to(where) for k, v in inputs.items()}
            if "pixel_values" in kwargs:
                kwargs["pixel_values"] = kwargs["pixel_values"].to(te.dtype)
            states = te(**kwargs, output_hidden_states=True).hidden_states[-1]
        mask = kwargs["attention_mask"].bool()
        items = [states[i][mask[i]][self.template_drop:] for i in range(len(texts))]
        return AdvancedPromptEmbeds(
            text_embeds=[t.to(self.device, self.dtype).clone() for t in items])

    @property
    def text_embedding_space_version(self) -> str:
        return f"{self.arch}-1"

    # ---- 3. train step -------------------------------------------------------------
    def control_size(self, control_hw: tuple[int, int], target_hw: tuple[int, int]
                     ) -> tuple[int, int]:
        """(H, W) in pixels a control is VAE-encoded at: the training image's size."""
        return target_hw

    def _control_pixels(self, batch: Any, target_hw: tuple[int, int]
                        ) -> list[torch.Tensor]:
        out = []
        for pixels in (batch.control_tensor_list or [])[:self.max_controls]:
            size = self.control_size(tuple(pixels.shape[-2:]), target_hw)
            if tuple(pixels.shape[-2:]) != size:
                pixels = F.interpolate(pixels.float(), size=size, mode="bilinear",
                                       antialias=True).clamp(0, 1)
            out.append(pixels)
        return out

    def condition_noisy_latents(self, noisy_latents: torch.Tensor, batch: Any
                                ) -> torch.Tensor:
        """The noisy image's tokens followed by each control's (module docstring)."""
        if batch is None or not batch.control_tensor_list:
            return noisy_latents
        h, w = noisy_latents.shape[-2:]
        scale = self.vae_scale_factor
        tokens = [self.pack(noisy_latents)]
        for pixels in self._control_pixels(batch, (h * scale, w * scale)):
            latents = self.encode_images(pixels * 2 - 1)
            tokens.append(self.pack(latents.to(noisy_latents.device, noisy_latents.dtype)))
        return torch.cat(tokens, dim=1)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        if latent_model_input.dim() == 4:  # no control: the text-to-image call
            return super().get_noise_prediction(latent_model_input, timestep,
                                                text_embeddings, batch, **kwargs)
        if batch is None or batch.latents is None:
            raise ModelError(f"{self.arch}: a packed input needs its batch (latent sizes)")
        h, w = batch.latents.shape[-2:]
        scale = self.vae_scale_factor
        controls = [p.shape[-2:] for p in self._control_pixels(batch, (h * scale, w * scale))]
        shapes = [(1, h // 2, w // 2)] + [(1, ch // scale // 2, cw // scale // 2)
                                          for ch, cw in controls]
        b = latent_model_input.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        context, mask = embeds.pad("text_embeds")
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        out = self.model(
            hidden_states=latent_model_input.to(self.device, self.dtype),
            encoder_hidden_states=context, encoder_hidden_states_mask=mask.long(),
            timestep=(t / 1000.0).to(self.dtype), img_shapes=[shapes] * b,
            return_dict=False)[0]
        return self.unpack(out[:, :(h // 2) * (w // 2)], h, w)

    # ---- 4. previews ---------------------------------------------------------------
    def generate_images(self, configs: Sequence[GenerateImageConfig],
                        prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None
                        ) -> list[Image.Image]:
        """As BaseModel's, with each prompt embedded together with its sample's control
        images (keys `prompt_key(text, ctrl_imgs)`; the trainer's cached preview embeds
        use the same keys)."""
        known = dict(prompt_embeds or {})
        images = []
        for cfg in configs:
            if not cfg.ctrl_imgs and cfg.ctrl_img is None:
                raise ModelError(f"{self.arch} previews edit a control image: give each "
                                 "sample a `ctrl_img` (sample.samples[].ctrl_img)")
            paths = cfg.ctrl_imgs or [cfg.ctrl_img]
            keys = [prompt_key(t, paths) for t in (cfg.prompt, cfg.negative_prompt)]
            missing = [(t, k) for t, k in zip((cfg.prompt, cfg.negative_prompt), keys,
                                              strict=True) if k not in known]
            if missing:
                controls = load_sample_controls(paths)
                with torch.no_grad():
                    for text, key in missing:
                        known[key] = self.get_prompt_embeds([text], control_images=controls
                                                            ).detach()
            images += super().generate_images(
                [cfg], {cfg.prompt: known[keys[0]], cfg.negative_prompt: known[keys[1]]})
        return images

    def get_generation_pipeline(self) -> Any:
        import diffusers
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config)
        pipeline = getattr(diffusers, self.pipeline_name)(
            scheduler=scheduler, vae=self.vae, text_encoder=None, tokenizer=None,
            processor=None, transformer=self.model)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def preview_controls(self, gen_config: GenerateImageConfig) -> Any:
        """What the pipeline's `image` gets: the control image (plus: the list)."""
        paths = (gen_config.ctrl_imgs or [gen_config.ctrl_img])[:self.max_controls]
        return open_sample_control(paths[0])

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        return run_pipeline(pipeline, gen_config, conditional_embeds, unconditional_embeds,
                            generator, self.device, self.dtype,
                            self.vae if self.low_vram else None,
                            image=self.preview_controls(gen_config))


class QwenImageEditPlusModel(QwenImageEditModel):
    arch = "qwen_image_edit_plus"
    has_multiple_control_images = True
    pipeline_name = "QwenImageEditPlusPipeline"
    max_controls = 3
    condition_area = CONDITION_IMAGE_SIZE

    def image_slots(self, count: int) -> str:
        return "".join(PICTURE_SLOT.format(i + 1) for i in range(count))

    def control_size(self, control_hw: tuple[int, int], target_hw: tuple[int, int]
                     ) -> tuple[int, int]:
        """About 1 MP at the control's aspect, as the pipeline; with `match_target_res`
        the training image's area instead."""
        from aitk.models.qwen_image_edit.vision import calculate_dimensions

        match = self.model_kwargs.match_target_res
        area = target_hw[0] * target_hw[1] if match else ONE_MEGAPIXEL
        width, height = calculate_dimensions(area, control_hw[1] / control_hw[0])
        return height, width

    def preview_controls(self, gen_config: GenerateImageConfig) -> Any:
        paths = (gen_config.ctrl_imgs or [gen_config.ctrl_img])[:self.max_controls]
        return [open_sample_control(p) for p in paths]

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        if not self.model_kwargs.match_target_res:
            return super().generate_single_image(pipeline, gen_config, conditional_embeds,
                                                 unconditional_embeds, generator)
        with vae_image_area(gen_config.width * gen_config.height):
            return super().generate_single_image(pipeline, gen_config, conditional_embeds,
                                                 unconditional_embeds, generator)


@contextlib.contextmanager
def vae_image_area(area: int) -> Iterator[None]:
    """QwenImageEditPlusPipeline sizes its references by the module constant
    VAE_IMAGE_SIZE (read at call time; no argument sets it): with `match_target_res`
    the previews use the preview's own area, as training does, for this call only."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    saved = plus.VAE_IMAGE_SIZE
    plus.VAE_IMAGE_SIZE = area
    try:
        yield
    finally:
        plus.VAE_IMAGE_SIZE = saved

