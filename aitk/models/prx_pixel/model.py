"""PRXPixelModel: the `prx_pixel` arch (Photoroom PRXPixel, pixel-space text to image).

`name_or_path`: a diffusers folder or hub id (e.g. Photoroom/prxpixel-t2i) with

    transformer/   PRXTransformer2DModel (in_channels 3, 16 px patches, no VAE)
    text_encoder/  Qwen3VLTextModel (the Qwen3-VL text tower; a whole Qwen3-VL
                   checkpoint works too: only its language model is read)
    tokenizer/     the Qwen tokenizer
    scheduler/     FlowMatchEulerDiscreteScheduler (fixed shift)

and the pipeline's own settings in model_index.json (`noise_scale`, `prompt_max_tokens`).

What is unusual, and where it is handled:
- Pixel space: the "latents" are the image itself, (B, 3, H, W) in [-1, 1];
  `encode_images`/`decode_latents` are the identity. The transformer cuts 16x16 patches
  itself, so image sides are multiples of `patch_size` (16): the bucket divisibility.
- x-prediction: the network predicts the clean image. Training (`XPredictionSchedule`):
  noise = N(0, 1) * `noise_scale` (2.0, as the model was trained), x_t = (1 - s) clean +
  s noise with s = t / 1000 shifted by the scheduler's `shift`, and the loss target is
  the clean image. Sampling (diffusers' PRXPixelPipeline) turns the prediction into a
  velocity, (x_t - x0) / max(s, 0.05), and starts from randn * noise_scale.
- Text: prompts are cleaned and tokenized as the pipeline does (padded to
  `prompt_max_tokens`, 256 for the released model), encoded to the text tower's
  last hidden state; each prompt keeps its real (unmasked) tokens, which the transformer
  sees exactly as it sees the pipeline's masked, padded batch.
- LoRA: diffusers has no LoRA loader for PRX. Files are the aitk layout
  (`diffusion_model.` + diffusers module names, with alpha); every save also writes the
  adapter as a peft folder `peft/` beside it (adapter_config.json +
  adapter_model.safetensors) that `peft.PeftModel.from_pretrained(transformer, folder)`
  loads onto diffusers' PRXTransformer2DModel (see aitk.models.prx_pixel.peft_adapter,
  which also converts any saved file).
- `model_kwargs`: `noise_scale`, `prompt_max_tokens` override model_index.json.
- `low_vram`: the text encoder stays on the CPU except while embedding.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from aitk.adapters.keys import from_public_keys, to_public_keys
from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.diffusion.timesteps import FlowShift
from aitk.errors import ModelLoadError
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.loading import freeze, load_part
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

# The released model's pipeline settings (diffusers' PRXPixelPipeline defaults), used when
# model_index.json does not say.
NOISE_SCALE = 2.0
PROMPT_MAX_TOKENS = 256
# The pipeline's floor on s when it turns the predicted image into a velocity.
MIN_VELOCITY_SIGMA = 0.05
# Kept in float by quantization: the patch, text, time and resolution embedders and the
# final layer are small and the most sensitive to rounding.
TRANSFORMER_QUANT_EXCLUDE = ("img_in", "img_in.*", "txt_in", "time_in.*",
                             "resolution_embedder.*", "final_layer.*")
PEFT_FOLDER = "peft"
# A whole Qwen3-VL checkpoint names the text tower `model.language_model.*`.
VL_TEXT_KEY_MAPPING = {r"^model\.language_model\.": ""}


@dataclass(frozen=True)
class XPredictionSchedule(FlowMatchSchedule):
    """Flow matching for a model that predicts the clean sample, with scaled noise:
    noise ~ N(0, 1) * noise_scale (the noise offset scales with it), x_t = (1 - s) clean +
    s noise, target = clean."""

    noise_scale: float = NOISE_SCALE

    def sample_noise(self, clean: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return super().sample_noise(clean, generator) * self.noise_scale

    def target(self, clean: torch.Tensor, noise: torch.Tensor,
               timesteps: torch.Tensor) -> torch.Tensor:
        return clean

    def predicted_clean(self, noisy: torch.Tensor, pred: torch.Tensor,
                        timesteps: torch.Tensor) -> torch.Tensor:
        return pred.float()  # the model predicts the clean sample itself


def clean_prompt(text: str) -> str:
    """The pipeline's light cleaning: ftfy (when installed), HTML entities, whitespace."""
    try:
        import ftfy
    except ImportError:
        pass
    else:
        text = ftfy.fix_text(text)
    return html.unescape(html.unescape(text)).strip()


class PRXPixelModel(BaseModel):
    arch = "prx_pixel"
    use_old_lokr_format = False
    lora_block_prefixes = ("blocks.",)

    @classmethod
    def build_tiny(cls, target: Path, seed: int = 0) -> None:
        from aitk.models.prx_pixel.tiny import build_tiny_prx_pixel

        build_tiny_prx_pixel(target, seed=seed)

    # ---- 1. load -------------------------------------------------------------------
    def load_model(self) -> None:
        from diffusers import FlowMatchEulerDiscreteScheduler, PRXTransformer2DModel
        from transformers import AutoTokenizer, Qwen3VLTextModel

        cfg = self.model_config
        name = str(cfg.name_or_path)
        transformer = load_part(PRXTransformer2DModel, name, "transformer", self.arch,
                                torch_dtype=self.dtype)
        text_encoder = load_text_tower(Qwen3VLTextModel, name, self.arch, self.dtype)
        tokenizer = load_part(AutoTokenizer, name, "tokenizer", self.arch)
        scheduler = load_part(FlowMatchEulerDiscreteScheduler, name, "scheduler", self.arch)
        # model_kwargs override the folder's model_index.json, which overrides the
        # released model's values.
        settings = pipeline_settings(name)
        kwargs = self.model_kwargs
        self.noise_scale = float(kwargs.noise_scale if kwargs.noise_scale is not None
                                 else settings.get("noise_scale", NOISE_SCALE))
        self.prompt_max_tokens = int(kwargs.prompt_max_tokens
                                     if kwargs.prompt_max_tokens is not None
                                     else settings.get("prompt_max_tokens", PROMPT_MAX_TOKENS))
        freeze(transformer, text_encoder)
        self.place_loaded([transformer], idle=[text_encoder])
        self.model, self.text_encoder, self.tokenizer = transformer, text_encoder, tokenizer
        self.noise_scheduler = scheduler
        self.quantize_transformer(transformer, exclude=TRANSFORMER_QUANT_EXCLUDE)
        self.quantize_text_encoder(text_encoder)

    # ---- 2. encoders ---------------------------------------------------------------
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Pixel space: the image in [-1, 1] is the latent."""
        return images.to(self.device, self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.to(self.device, torch.float32)

    def get_prompt_embeds(self, prompts: list[str],
                          control_images: list[torch.Tensor] | None = None
                          ) -> AdvancedPromptEmbeds:
        """One (L_i, D) tensor per prompt: the text tower's last hidden state at the
        prompt's real tokens, tokenized and padded as PRXPixelPipeline does."""
        if self.text_encoder is None:
            raise ModelLoadError("the text encoder is unloaded (text embeddings cached)")
        tokens = self.tokenizer([clean_prompt(p) for p in prompts], padding="max_length",
                                max_length=self.prompt_max_tokens, truncation=True,
                                return_attention_mask=True, return_tensors="pt")
        te = self.text_encoder
        with torch.no_grad(), self.on_device(te):
            where = next(te.parameters()).device
            mask = tokens.attention_mask.bool().to(where)
            states = te(input_ids=tokens.input_ids.to(where), attention_mask=mask,
                        output_hidden_states=True)["last_hidden_state"]
        return AdvancedPromptEmbeds(text_embeds=[
            states[i][mask[i]].to(self.device, self.dtype).clone()
            for i in range(len(prompts))])

    @property
    def text_embedding_space_version(self) -> str:
        return f"prx_pixel-1-{self.prompt_max_tokens}"

    @property
    def latent_space_version(self) -> str:
        return "prx_pixel-pixels-1"

    # ---- 3. train step -------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        return XPredictionSchedule(
            settings, FlowShift.from_scheduler_config(self.noise_scheduler.config),
            image_tokens(self.model.config.patch_size), noise_scale=self.noise_scale)

    def get_noise_prediction(self, latent_model_input: torch.Tensor, timestep: torch.Tensor,
                             text_embeddings: AdvancedPromptEmbeds, batch: Any = None,
                             **kwargs: Any) -> torch.Tensor:
        """The predicted clean image (B, 3, H, W); the network takes s = t / 1000."""
        b = latent_model_input.shape[0]
        embeds = text_embeddings.expand_to_batch(b).to(self.device, self.dtype)
        context, mask = embeds.pad("text_embeds")
        t = torch.as_tensor(timestep, device=self.device, dtype=torch.float32).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        return self.model(hidden_states=latent_model_input.to(self.device, self.dtype),
                          timestep=t / 1000.0, encoder_hidden_states=context,
                          attention_mask=mask, return_dict=False)[0]

    # ---- 4. previews ---------------------------------------------------------------
    def get_generation_pipeline(self) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler, PRXPixelPipeline

        pipeline = PRXPixelPipeline(
            transformer=self.model, text_encoder=None, tokenizer=None,
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(self.noise_scheduler.config),
            prompt_max_tokens=self.prompt_max_tokens, noise_scale=self.noise_scale)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def generate_single_image(self, pipeline: Any, gen_config: GenerateImageConfig,
                              conditional_embeds: AdvancedPromptEmbeds,
                              unconditional_embeds: AdvancedPromptEmbeds,
                              generator: torch.Generator) -> Image.Image:
        self.check_sample_size(gen_config,
                               f"PRXPixel: {self.get_bucket_divisibility()} px patches")
        return run_pipeline(pipeline, gen_config, conditional_embeds, unconditional_embeds,
                            generator, self.device, self.dtype)

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return to_public_keys(state_dict)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return from_public_keys(state_dict)

    def on_lora_file_saved(self, path: Path, network: Any) -> None:
        """Beside each saved LoRA file, `peft/` holds the same adapter as a peft folder
        (the latest save: the final LoRA once training ends)."""
        from aitk.models.prx_pixel.peft_adapter import write_network

        write_network(network, Path(path).parent / PEFT_FOLDER, source=Path(path).name)

    # ---- properties the trainer reads ----------------------------------------------
    def get_bucket_divisibility(self) -> int:
        return int(self.model.config.patch_size)  # no VAE: vae_scale_factor 1


def load_text_tower(cls: Any, name_or_path: str, arch: str, dtype: torch.dtype) -> Any:
    """The Qwen3-VL text tower from `text_encoder/`: a text-only checkpoint as diffusers
    saves it, or a whole Qwen3-VL checkpoint whose language model is read alone (its
    vision tower is never built). A checkpoint that leaves weights of the tower unset
    is refused rather than run half random."""
    model, info = load_part(cls, name_or_path, "text_encoder", arch, dtype=dtype,
                            key_mapping=VL_TEXT_KEY_MAPPING, output_loading_info=True)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(f"the {arch} text_encoder in {name_or_path} is not a Qwen3-VL "
                             f"text model: {len(missing)} weights missing (e.g. "
                             f"{missing[0]}); expected Qwen3VLTextModel or Qwen3-VL weights")
    return model


def pipeline_settings(name_or_path: str) -> dict[str, Any]:
    """`noise_scale` / `prompt_max_tokens` from the folder's (or cached hub id's)
    model_index.json; {} when there is none."""
    root = Path(name_or_path).expanduser()
    try:
        if root.is_dir():
            index = root / "model_index.json"
            raw = index.read_text(encoding="utf-8") if index.is_file() else "{}"
        else:
            from huggingface_hub import hf_hub_download

            raw = Path(hf_hub_download(name_or_path, "model_index.json")).read_text(
                encoding="utf-8")
        data = json.loads(raw)
    except Exception:  # noqa: BLE001 - optional settings: the released defaults apply
        return {}
    return {k: data[k] for k in ("noise_scale", "prompt_max_tokens") if k in data}


def run_pipeline(pipeline: Any, gen_config: GenerateImageConfig,
                 conditional: AdvancedPromptEmbeds, unconditional: AdvancedPromptEmbeds,
                 generator: torch.Generator, device: torch.device, dtype: torch.dtype
                 ) -> Image.Image:
    """One image from diffusers' PRXPixelPipeline, called with embeds only (padded and
    masked), at the asked size (no aspect-ratio binning). Shared by the trainer's previews
    and the interop test (the same call on a pipeline whose transformer got the LoRA
    through peft)."""
    guidance = max(1.0, float(gen_config.guidance_scale))
    kwargs: dict[str, Any] = {}
    if guidance > 1.0:  # CFG: both halves padded to one length, the pads masked
        both = AdvancedPromptEmbeds.cat([unconditional, conditional]).to(device, dtype)
        states, mask = both.pad("text_embeds")
        kwargs = {"negative_prompt_embeds": states[:1],
                  "negative_prompt_attention_mask": mask[:1]}
        states, mask = states[1:], mask[1:]
    else:
        states, mask = conditional.to(device, dtype).pad("text_embeds")
    return pipeline(prompt_embeds=states, prompt_attention_mask=mask,
                    guidance_scale=guidance, width=gen_config.width,
                    height=gen_config.height, num_inference_steps=gen_config.sample_steps,
                    generator=generator, use_resolution_binning=False, output_type="pil",
                    **kwargs).images[0]
