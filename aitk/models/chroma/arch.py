"""The `chroma` arch described without torch (aitk.models.description): Chroma, Flux's
architecture pruned and guidance-distilled, T5 only."""

from __future__ import annotations

from aitk.models.description import (
    ArchDescription,
    Capabilities,
    Defaults,
    Examples,
    Lora,
    Part,
    PartRole,
    Variant,
)
from aitk.models.flux.arch import FLOW_MATCHING, FLUX_LORA_KEYS, FLUX_LORA_READS, VAE, FluxKwargs
from aitk.models.flux.arch import T5_XXL as FLUX_T5

T5_XXL = Part("text_encoder", FLUX_T5.role, FLUX_T5.params)  # Chroma's only text encoder
TRANSFORMER = Part("transformer", PartRole.DENOISER, 8_899_983_424, blocks=57,
                   block_params=8_608_715_776)

CHROMA = ArchDescription(
    name="chroma",
    summary="Chroma: an 8.9B open Flux-architecture text-to-image model (T5 only, no "
            "guidance embedding)",
    model_class="aitk.models.chroma.model:ChromaModel",
    quantizes_while_loading=True,
    size_multiple=16,
    capabilities=Capabilities(),
    schedule=FLOW_MATCHING,
    model_kwargs=FluxKwargs,
    # ComfyUI's Chroma is a Flux model, so Flux's diffusers-name table applies.
    lora=Lora(FLUX_LORA_KEYS, FLUX_LORA_READS,
              ("diffusers ChromaPipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("hd", "Chroma1-HD", ("lodestones/Chroma1-HD",),
                      (TRANSFORMER, T5_XXL, VAE)),),
    defaults=Defaults(resolution=(512, 768, 1024), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="flux_shift", quantize=True),
    examples=Examples("train_lora_chroma_tiny_cpu.yaml", "train_lora_chroma_24gb.yaml"),
)

DESCRIPTIONS = (CHROMA,)
