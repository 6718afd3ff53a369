"""The `prx_pixel` arch described without torch (aitk.models.description): Photoroom's
PRXPixel, a pixel-space (no VAE) x-prediction transformer with a Qwen3-VL text tower."""

from __future__ import annotations

from pydantic import Field

from aitk.models.description import (
    FLOWMATCH_SCHEDULERS,
    ArchDescription,
    ArchKwargs,
    Capabilities,
    Defaults,
    Examples,
    KeyStyle,
    Lora,
    LoraKeys,
    ModuleNames,
    Part,
    PartRole,
    Schedule,
    Variant,
)


class PRXPixelKwargs(ArchKwargs):
    noise_scale: float | None = Field(
        None, gt=0, description="start-noise scale (default model_index.json's, 2.0)")
    prompt_max_tokens: int | None = Field(
        None, ge=1, description="prompt tokens (default model_index.json's, 256)")


PRX_PIXEL = ArchDescription(
    name="prx_pixel",
    summary="PRXPixel: Photoroom's pixel-space text-to-image model (no VAE)",
    model_class="aitk.models.prx_pixel.model:PRXPixelModel",
    size_multiple=16,  # the transformer's own 16 px patches
    capabilities=Capabilities(),
    # Flow matching that predicts the clean image (x-prediction).
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=PRXPixelKwargs,
    # diffusers has no PRX LoRA loader: each save also writes a peft folder beside it.
    lora=Lora(LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
              (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),),
              ("peft PeftModel.from_pretrained on PRXTransformer2DModel (the peft/ folder)",)),
    # The released config was not readable here: sizes unknown until it is.
    variants=(Variant("t2i", "PRXPixel text to image (~7B transformer)",
                      ("Photoroom/prxpixel-t2i",),
                      (Part("transformer", PartRole.DENOISER, None),
                       Part("text_encoder", PartRole.TEXT_ENCODER, None))),),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="shift", quantize=True),
    examples=Examples("train_lora_prx_pixel_tiny_cpu.yaml", "train_lora_prx_pixel_24gb.yaml"),
)

DESCRIPTIONS = (PRX_PIXEL,)
