"""The `sdxl` arch described without torch (aitk.models.description): Stable Diffusion
XL, a UNet trained with DDPM noise (epsilon or v-prediction)."""

from __future__ import annotations

from pydantic import Field

from aitk.models.description import (
    DDPM_SCHEDULERS,
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


class SDXLKwargs(ArchKwargs):
    variant: str | None = Field(
        None, min_length=1, description="weight-file variant to load, e.g. fp16 (the "
                                        "hub's *.fp16.safetensors: half the download)")


SDXL = ArchDescription(
    name="sdxl",
    summary="Stable Diffusion XL: the 2023 Stability AI model most fine-tunes build on",
    model_class="aitk.models.sdxl.model:SDXLModel",
    upstream_flags=("is_xl",),
    size_multiple=32,  # VAE 8 x 4: each UNet down block but the last halves the latent
    capabilities=Capabilities(),
    schedule=Schedule("ddpm", DDPM_SCHEDULERS),
    model_kwargs=SDXLKwargs,
    # kohya over diffusers' UNet module names: ComfyUI, A1111/Forge and diffusers read it;
    # the text encoders' LoRA (train_text_encoder) as kohya's lora_te1_ / lora_te2_.
    lora=Lora(LoraKeys("lora_unet_", ModuleNames.DIFFUSERS, KeyStyle.KOHYA),
              (LoraKeys("unet.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
               LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)),
              ("diffusers StableDiffusionXLPipeline.load_lora_weights", "ComfyUI"),
              text_encoders=(LoraKeys("lora_te1_", ModuleNames.DIFFUSERS, KeyStyle.KOHYA),
                             LoraKeys("lora_te2_", ModuleNames.DIFFUSERS, KeyStyle.KOHYA))),
    variants=(Variant("base", "SDXL base 1.0", ("stabilityai/stable-diffusion-xl-base-1.0",),
                      (Part("unet", PartRole.DENOISER, 2_567_463_684, blocks=6,
                            block_params=2_147_026_240),  # 3 down + 3 up blocks
                       Part("text_encoder", PartRole.TEXT_ENCODER, 123_060_480),
                       Part("text_encoder_2", PartRole.TEXT_ENCODER, 694_659_840),
                       Part("vae", PartRole.VAE, 83_653_863, float32=True))),),
    defaults=Defaults(resolution=(768, 1024), steps=2000, rank=32, alpha=32, lr=1e-4,
                      timestep_type=None, quantize=False),
    examples=Examples("train_lora_sdxl_tiny_cpu.yaml", "train_lora_sdxl_24gb.yaml"),
)

DESCRIPTIONS = (SDXL,)
