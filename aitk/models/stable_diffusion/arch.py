"""The `sd1` and `sd2` archs described without torch (aitk.models.description): Stable
Diffusion 1.x and 2.x, a UNet over one CLIP text encoder trained with DDPM noise
(epsilon, or v-prediction for the 768-v 2.x models)."""

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


class SDKwargs(ArchKwargs):
    variant: str | None = Field(
        None, min_length=1, description="weight-file variant to load, e.g. fp16 (the "
                                        "hub's *.fp16.safetensors: half the download)")


# kohya over diffusers' UNet names and transformers' CLIP names: ComfyUI, A1111/Forge and
# diffusers read it; ComfyUI maps `lora_te_` onto SD 1.x's clip_l and SD 2.x's clip_h.
LORA = Lora(LoraKeys("lora_unet_", ModuleNames.DIFFUSERS, KeyStyle.KOHYA),
            (LoraKeys("unet.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
             LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)),
            ("diffusers StableDiffusionPipeline.load_lora_weights", "ComfyUI"),
            text_encoders=(LoraKeys("lora_te_", ModuleNames.DIFFUSERS, KeyStyle.KOHYA),))
VAE = Part("vae", PartRole.VAE, 83_653_863, float32=True)
# A UNet's repeated blocks: its 4 down and 4 up blocks.
SD1_PARTS = (Part("unet", PartRole.DENOISER, 859_520_964, blocks=8, block_params=760_408_320),
             Part("text_encoder", PartRole.TEXT_ENCODER, 123_060_480), VAE)
SD2_PARTS = (Part("unet", PartRole.DENOISER, 865_910_724, blocks=8, block_params=766_142_720),
             Part("text_encoder", PartRole.TEXT_ENCODER, 340_387_840), VAE)
# VAE 8 x the UNet's three halvings (each down block but the last): kohya's 64 px steps.
SIZE_MULTIPLE = 64

SD1 = ArchDescription(
    name="sd1",
    summary="Stable Diffusion 1.x (1.5 and its fine-tunes): 512 px, CLIP ViT-L text encoder",
    model_class="aitk.models.stable_diffusion.model:SD1Model",
    aliases=("sd15",),
    # Upstream derives sd1 when no `is_*` flag is set (aitk.config.upstream_keys).
    size_multiple=SIZE_MULTIPLE,
    capabilities=Capabilities(),
    schedule=Schedule("ddpm", DDPM_SCHEDULERS),
    model_kwargs=SDKwargs,
    lora=LORA,
    variants=(Variant("v1-5", "Stable Diffusion 1.5",
                      ("stable-diffusion-v1-5/stable-diffusion-v1-5",), SD1_PARTS),),
    defaults=Defaults(resolution=(512,), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type=None, quantize=False),
    examples=Examples("train_lora_sd1_tiny_cpu.yaml", "train_lora_sd1_24gb.yaml"),
)

SD2 = ArchDescription(
    name="sd2",
    summary="Stable Diffusion 2.x: 768-v (v-prediction) and 512 base, OpenCLIP-H text encoder",
    model_class="aitk.models.stable_diffusion.model:SD2Model",
    upstream_flags=("is_v2",),
    size_multiple=SIZE_MULTIPLE,
    capabilities=Capabilities(),
    schedule=Schedule("ddpm", DDPM_SCHEDULERS),
    model_kwargs=SDKwargs,
    lora=LORA,
    variants=(Variant("768-v", "Stable Diffusion 2.1 (768 px, v-prediction)",
                      ("stabilityai/stable-diffusion-2-1",), SD2_PARTS),
              Variant("base", "Stable Diffusion 2.1 base (512 px, epsilon)",
                      ("stabilityai/stable-diffusion-2-1-base",), SD2_PARTS)),
    defaults=Defaults(resolution=(768,), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type=None, quantize=False),
    examples=Examples("train_lora_sd2_tiny_cpu.yaml", "train_lora_sd2_24gb.yaml"),
)

DESCRIPTIONS = (SD1, SD2)
