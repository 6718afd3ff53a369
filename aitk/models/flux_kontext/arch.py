"""The `flux_kontext` arch described without torch (aitk.models.description): FLUX.1
Kontext dev, Flux's transformer editing a reference image."""

from __future__ import annotations

from aitk.models.description import (
    ArchDescription,
    Capabilities,
    Defaults,
    Examples,
    Lora,
    Variant,
)
from aitk.models.flux.arch import (
    CLIP_L,
    DEV_TRANSFORMER,
    FLOW_MATCHING,
    FLUX_LORA_KEYS,
    FLUX_LORA_READS,
    T5_XXL,
    VAE,
    FluxKwargs,
)

FLUX_KONTEXT = ArchDescription(
    name="flux_kontext",
    summary="FLUX.1 Kontext dev: edits an image as a prompt says (pairs of control and "
            "target images)",
    model_class="aitk.models.flux_kontext.model:FluxKontextModel",
    quantizes_while_loading=True,
    size_multiple=16,
    capabilities=Capabilities(control_images=1),
    schedule=FLOW_MATCHING,
    model_kwargs=FluxKwargs,
    lora=Lora(FLUX_LORA_KEYS, FLUX_LORA_READS,
              ("diffusers FluxKontextPipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("dev", "FLUX.1 Kontext [dev]", ("black-forest-labs/FLUX.1-Kontext-dev",),
                      (DEV_TRANSFORMER, CLIP_L, T5_XXL, VAE)),),
    defaults=Defaults(resolution=(512, 768), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="weighted", quantize=True),
    examples=Examples("train_lora_flux_kontext_tiny_cpu.yaml",
                      "train_lora_flux_kontext_24gb.yaml"),
)

DESCRIPTIONS = (FLUX_KONTEXT,)
