"""The `flux` arch described without torch (aitk.models.description): FLUX.1 dev and
schnell. Its parts (CLIP-L, T5-XXL, the 16-channel VAE) and LoRA layout are shared with
flux_kontext and chroma, which build on this arch."""

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


class FluxKwargs(ArchKwargs):
    max_sequence_length: int | None = Field(
        None, ge=1, description="T5 tokens per prompt (default the tokenizer's limit, at "
                                "most 512; schnell was trained with 256)")


FLOW_MATCHING = Schedule("flowmatch", FLOWMATCH_SCHEDULERS)

# Counts: the real configs built on the meta device (the folder's real_parts.py).
CLIP_L = Part("text_encoder", PartRole.TEXT_ENCODER, 123_060_480)
T5_XXL = Part("text_encoder_2", PartRole.TEXT_ENCODER, 4_762_310_656)
VAE = Part("vae", PartRole.VAE, 83_819_683, float32=True)
# 19 double-stream + 38 single-stream blocks.
DEV_TRANSFORMER = Part("transformer", PartRole.DENOISER, 11_901_408_320, blocks=57,
                       block_params=11_837_283_328)
SCHNELL_TRANSFORMER = Part("transformer", PartRole.DENOISER, 11_891_178_560, blocks=57,
                           block_params=11_837_283_328)  # no guidance embedder

# `transformer.` + diffusers names: diffusers' Flux loaders and ComfyUI read it; a
# `diffusion_model.` Flux file is silently ignored by diffusers (read back here only).
FLUX_LORA_KEYS = LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)
FLUX_LORA_READS = (LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),)

FLUX = ArchDescription(
    name="flux",
    summary="FLUX.1 dev and schnell: Black Forest Labs' 12B text-to-image transformer",
    model_class="aitk.models.flux.model:FluxModel",
    quantizes_while_loading=True,
    aliases=("flex1",),  # upstream reads `arch: flex1` as flux
    upstream_flags=("is_flux",),
    size_multiple=16,  # VAE 8 x 2x2 packing
    capabilities=Capabilities(attn_masking=True),
    schedule=FLOW_MATCHING,
    model_kwargs=FluxKwargs,
    lora=Lora(FLUX_LORA_KEYS, FLUX_LORA_READS,
              ("diffusers FluxPipeline.load_lora_weights", "ComfyUI")),
    variants=(
        Variant("dev", "FLUX.1 [dev], guidance-distilled", ("black-forest-labs/FLUX.1-dev",),
                (DEV_TRANSFORMER, CLIP_L, T5_XXL, VAE)),
        Variant("schnell", "FLUX.1 [schnell], step-distilled (train with its assistant LoRA)",
                ("black-forest-labs/FLUX.1-schnell",),
                (SCHNELL_TRANSFORMER, CLIP_L, T5_XXL, VAE)),
    ),
    defaults=Defaults(resolution=(512, 768, 1024), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="flux_shift", quantize=True),
    examples=Examples("train_lora_flux_tiny_cpu.yaml", "train_lora_flux_24gb.yaml"),
)

DESCRIPTIONS = (FLUX,)
