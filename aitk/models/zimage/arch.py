"""The `zimage` arch described without torch (aitk.models.description): Tongyi-MAI's
Z-Image, a 6B single-stream transformer with a Qwen3-4B text encoder and FLUX.1's VAE.

Three releases share the shapes, told apart by upstream's `arch:` tags (its web UI's
three choices; `arch: zimage:turbo` fills in what that choice does, see `tag_defaults`):

- `turbo`: Z-Image Turbo, step-distilled (8-9 steps, no CFG). Trained through ostris'
  de-distillation adapter, merged into the frozen weights at load
  (`model.assistant_lora_path`, aitk.models.assistant) and taken out for previews.
- `base` (plain `zimage`): the undistilled Z-Image.
- `deturbo`: ostris' De-Turbo, Turbo de-distilled; its repo holds the transformer only,
  the other parts come from `model.extras_name_or_path` (Z-Image Turbo's).
"""

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


class ZImageKwargs(ArchKwargs):
    max_sequence_length: int | None = Field(
        None, ge=1, description="prompt tokens, chat template included (default 512, "
                                "the pipeline's)")


TURBO_REPO = "Tongyi-MAI/Z-Image-Turbo"
# ostris/zimage_turbo_training_adapter, as upstream's web UI fills it in for `zimage:turbo`.
TURBO_ADAPTER = ("ostris/zimage_turbo_training_adapter/"
                 "zimage_turbo_training_adapter_v2.safetensors")

# Counts: the real configs built on the meta device (the folder's real_parts.py).
# 30 main layers + 2 noise-refiner + 2 context-refiner blocks.
TRANSFORMER = Part("transformer", PartRole.DENOISER, 6_154_908_736, blocks=34,
                   block_params=6_143_056_384)
TEXT_ENCODER = Part("text_encoder", PartRole.TEXT_ENCODER, 4_022_468_096)  # Qwen3-4B, no LM head
VAE = Part("vae", PartRole.VAE, 83_819_683, float32=True)  # FLUX.1's
PARTS = (TRANSFORMER, TEXT_ENCODER, VAE)

# `diffusion_model.` + diffusers names with alpha: what upstream writes, diffusers'
# ZImagePipeline.load_lora_weights converts, and ComfyUI maps (z_image_to_diffusers).
LORA_KEYS = LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)
LORA_READS = (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),)

ZIMAGE = ArchDescription(
    name="zimage",
    summary="Z-Image: Tongyi-MAI's 6B text-to-image model (Turbo, base, De-Turbo)",
    model_class="aitk.models.zimage.model:ZImageModel",
    size_multiple=16,  # VAE 8 x 2x2 patches
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=ZImageKwargs,
    lora=Lora(LORA_KEYS, LORA_READS, ("diffusers ZImagePipeline.load_lora_weights",
                                      "ComfyUI")),
    variants=(
        Variant("turbo", "Z-Image Turbo, step-distilled (trained with its training adapter)",
                (TURBO_REPO,), PARTS,
                tag_defaults=(("model.name_or_path", TURBO_REPO),
                              ("model.assistant_lora_path", TURBO_ADAPTER),
                              ("sample.guidance_scale", 1.0),
                              ("sample.sample_steps", 9))),
        Variant("base", "Z-Image, undistilled", ("Tongyi-MAI/Z-Image",), PARTS,
                tag_defaults=(("model.name_or_path", "Tongyi-MAI/Z-Image"),
                              ("sample.sample_steps", 30))),
        Variant("deturbo", "Z-Image De-Turbo: Turbo de-distilled (its other parts from "
                           "Z-Image Turbo)", ("ostris/Z-Image-De-Turbo", TURBO_REPO), PARTS,
                tag_defaults=(("model.name_or_path", "ostris/Z-Image-De-Turbo"),
                              ("model.extras_name_or_path", TURBO_REPO),
                              ("sample.guidance_scale", 3.0),
                              ("sample.sample_steps", 25))),
    ),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="weighted", quantize=True),
    examples=Examples("train_lora_zimage_tiny_cpu.yaml", "train_lora_zimage_24gb.yaml"),
)

DESCRIPTIONS = (ZIMAGE,)
