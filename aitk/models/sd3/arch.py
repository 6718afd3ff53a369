"""The `sd3` arch described without torch (aitk.models.description): Stable Diffusion 3.5
medium and large, Stability AI's MMDiT with three text encoders (CLIP-L, OpenCLIP
bigG, T5-XXL), a 16-channel VAE and flow matching with a fixed shift of 3."""

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


class SD3Kwargs(ArchKwargs):
    max_sequence_length: int | None = Field(
        None, ge=1, le=512, description="T5 tokens per prompt (default 256, what "
                                        "StableDiffusion3Pipeline and upstream use)")


# Counts: the real configs built on the meta device (the folder's real_parts.py).
# Both releases share the text encoders and the VAE.
CLIP_L = Part("text_encoder", PartRole.TEXT_ENCODER, 123_650_304)  # with its projection
CLIP_G = Part("text_encoder_2", PartRole.TEXT_ENCODER, 694_659_840)
T5_XXL = Part("text_encoder_3", PartRole.TEXT_ENCODER, 4_762_310_656)
VAE = Part("vae", PartRole.VAE, 83_819_683, float32=True)
LARGE_TRANSFORMER = Part("transformer", PartRole.DENOISER, 8_056_627_520, blocks=38,
                         block_params=8_017_073_408)
# 24 blocks, the first 13 with a second (image-only) attention: MMDiT-X.
MEDIUM_TRANSFORMER = Part("transformer", PartRole.DENOISER, 2_243_171_520, blocks=24,
                          block_params=2_223_694_976)

# `transformer.` + diffusers names, PEFT suffixes, no `.alpha` entries: diffusers' SD3
# loader refuses a key without "lora" in it, so alpha / rank is folded into lora_B and
# every reader (diffusers, ComfyUI) applies scale 1. ComfyUI maps these names onto its
# MMDiT (comfy.utils.mmdit_to_diffusers). `diffusion_model.` files read back too.
SD3_LORA = Lora(LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
                (LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),),
                ("diffusers StableDiffusion3Pipeline.load_lora_weights", "ComfyUI"),
                alpha_keys=False)

SD3 = ArchDescription(
    name="sd3",
    summary="Stable Diffusion 3.5 medium and large: Stability AI's MMDiT text-to-image models",
    model_class="aitk.models.sd3.model:SD3Model",
    upstream_flags=("is_v3",),
    size_multiple=16,  # VAE 8 x 2x2 patches
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=SD3Kwargs,
    lora=SD3_LORA,
    variants=(
        Variant("large", "SD 3.5 Large (8B MMDiT; Large Turbo has the same shapes)",
                ("stabilityai/stable-diffusion-3.5-large",
                 "stabilityai/stable-diffusion-3.5-large-turbo"),
                (LARGE_TRANSFORMER, CLIP_L, CLIP_G, T5_XXL, VAE)),
        Variant("medium", "SD 3.5 Medium (2.2B MMDiT-X: 13 blocks with a second attention)",
                ("stabilityai/stable-diffusion-3.5-medium",),
                (MEDIUM_TRANSFORMER, CLIP_L, CLIP_G, T5_XXL, VAE)),
    ),
    defaults=Defaults(resolution=(1024,), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="linear", quantize=True),
    examples=Examples("train_lora_sd3_tiny_cpu.yaml", "train_lora_sd3_24gb.yaml"),
)

DESCRIPTIONS = (SD3,)
