"""The FLUX.2 [klein] archs described without torch (aitk.models.description):
`flux2_klein_4b` and `flux2_klein_9b` (upstream's names) and `flux2_klein`, the same
class for either size (the weights decide)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

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


class KleinKwargs(ArchKwargs):
    max_sequence_length: int | None = Field(
        None, ge=1, description="prompt tokens (default 512, or the tokenizer's limit)")
    text_encoder_out_layers: tuple[int, ...] | None = Field(
        None, min_length=1, description="Qwen3 hidden states stacked per token "
                                        "(default 9, 18, 27)")
    shift_steps: int | None = Field(
        None, ge=1, description="sampling steps the `shift` timestep type's mu is taken at "
                                "(default 50, or 4 for a step-distilled model)")
    is_distilled: bool | None = Field(
        None, description="step-distilled weights (default: model_index.json says)")
    # Upstream's form writes it for klein's edit mode; aitk trains klein text to image.
    match_target_res: Literal[False] = Field(
        False, description="upstream's reference-image sizing; klein here takes no "
                           "control images, so only false")


VAE = Part("vae", PartRole.VAE, 84_046_115, float32=True)
# Qwen3 loaded without its LM head; decoder layers past the deepest one read (27 of 36)
# are dropped at load (kept_params).
VARIANT_4B = Variant(
    "4b", "FLUX.2 [klein] 4B (Qwen3-4B text encoder); base for training, or step-distilled",
    ("black-forest-labs/FLUX.2-klein-base-4B", "black-forest-labs/FLUX.2-klein-4B"),
    (Part("transformer", PartRole.DENOISER, 3_875_544_576, blocks=25,
          block_params=3_680_509_440),
     Part("text_encoder", PartRole.TEXT_ENCODER, 4_022_468_096, kept_params=3_215_021_568),
     VAE))
VARIANT_9B = Variant(
    "9b", "FLUX.2 [klein] 9B (Qwen3-8B text encoder); base for training, or step-distilled",
    ("black-forest-labs/FLUX.2-klein-base-9B", "black-forest-labs/FLUX.2-klein-9B"),
    (Part("transformer", PartRole.DENOISER, 9_078_581_248, blocks=32,
          block_params=8_724_162_560),
     Part("text_encoder", PartRole.TEXT_ENCODER, 7_568_405_504, kept_params=6_024_834_048),
     VAE))

FLUX2_KLEIN_4B = ArchDescription(
    name="flux2_klein_4b",
    summary="FLUX.2 [klein] 4B: a small, fast Black Forest Labs text-to-image model",
    model_class="aitk.models.flux2_klein.model:Flux2Klein4BModel",
    quantizes_while_loading=True,
    size_multiple=16,  # VAE 8 x 2x2 patchified latents
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=KleinKwargs,
    # kohya names over BFL's modules (q/k/v fused into `qkv`), what ComfyUI maps; also
    # read: upstream's `diffusion_model.` + BFL names, aitk's older diffusers names.
    lora=Lora(LoraKeys("lora_unet_", ModuleNames.ORIGINAL, KeyStyle.KOHYA),
              (LoraKeys("diffusion_model.", ModuleNames.ORIGINAL, KeyStyle.PEFT),
               LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)),
              ("diffusers Flux2KleinPipeline.load_lora_weights", "ComfyUI")),
    variants=(VARIANT_4B,),
    defaults=Defaults(resolution=(512, 768, 1024), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="shift", quantize=True),
    examples=Examples("train_lora_flux2_klein_tiny_cpu.yaml",
                      "train_lora_flux2_klein_24gb.yaml"),
)
FLUX2_KLEIN_9B = replace(
    FLUX2_KLEIN_4B, name="flux2_klein_9b",
    summary="FLUX.2 [klein] 9B: the larger FLUX.2 [klein] (non-commercial license)",
    model_class="aitk.models.flux2_klein.model:Flux2Klein9BModel",
    quantizes_while_loading=True, variants=(VARIANT_9B,))
FLUX2_KLEIN = replace(
    FLUX2_KLEIN_4B, name="flux2_klein",
    summary="FLUX.2 [klein], 4B or 9B: the size follows the weights in name_or_path",
    model_class="aitk.models.flux2_klein.model:Flux2KleinModel",
    quantizes_while_loading=True,
    variants=(VARIANT_4B, VARIANT_9B))

DESCRIPTIONS = (FLUX2_KLEIN_4B, FLUX2_KLEIN_9B, FLUX2_KLEIN)
