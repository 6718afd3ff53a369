"""The `ideogram4` arch described without torch (aitk.models.description): Ideogram 4, a
9.3B single-stream DiT over one packed [text | image] sequence, conditioned on 13 tapped
hidden-state layers of Qwen3-VL-8B, with FLUX.2's VAE, and a second (unconditional)
transformer of the same shape that only the pipeline's asymmetric guidance runs.

The LoRA trains `transformer`; `unconditional_transformer` is loaded for previews only
(quantized with the transformer, on the CPU with `low_vram`). Upstream's
`model.unconditional_lora_path` (a LoRA standing in for the unconditional transformer
on its fp8 single checkpoint) has no counterpart: the diffusers layout ships the real
unconditional transformer.
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


class Ideogram4Kwargs(ArchKwargs):
    # Upstream's knob and default (its Ideogram4Model reads model_kwargs.max_text_length):
    # a cap, by truncation, for the long structured (JSON) captions Ideogram 4 takes.
    max_text_length: int | None = Field(
        None, ge=1, description="prompt tokens kept, chat template included (default "
                                "3072, upstream's); longer prompts are truncated")


REPO = "ideogram-ai/ideogram-v4"  # diffusers' Ideogram4Pipeline example id

# Counts: the real configs built on the meta device (the folder's real_parts.py).
TRANSFORMER = Part("transformer", PartRole.DENOISER, 9_279_288_448, blocks=34,
                   block_params=8_985_469_952)
UNCONDITIONAL = Part("unconditional_transformer", PartRole.GUIDANCE, 9_279_288_448)
# Qwen3-VL-8B-Instruct as Qwen3VLModel (no LM head); text to image drops its vision tower.
TEXT_ENCODER = Part("text_encoder", PartRole.TEXT_ENCODER, 8_144_793_840,
                    kept_params=7_568_405_504)
VAE = Part("vae", PartRole.VAE, 84_046_115, float32=True)  # FLUX.2's
PARTS = (TRANSFORMER, UNCONDITIONAL, TEXT_ENCODER, VAE)

# `diffusion_model.` + Ideogram's own module names (layers.N.attention.qkv fused, .o,
# feed_forward.w1..3, adaln_modulation), no alpha keys (alpha folded into the up
# weights): upstream ai-toolkit's layout, which diffusers'
# Ideogram4Pipeline.load_lora_weights converts (aitk.models.ideogram4.lora_keys).
LORA_KEYS = LoraKeys("diffusion_model.", ModuleNames.ORIGINAL, KeyStyle.PEFT)
LORA_READS = (LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
              LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT))

IDEOGRAM4 = ArchDescription(
    name="ideogram4",
    summary="Ideogram 4: Ideogram's 9.3B text-to-image DiT (Qwen3-VL-8B text encoder)",
    model_class="aitk.models.ideogram4.model:Ideogram4Model",
    size_multiple=16,  # VAE 8 x 2x2 patches (the pipeline's check)
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=Ideogram4Kwargs,
    lora=Lora(LORA_KEYS, LORA_READS, ("diffusers Ideogram4Pipeline.load_lora_weights",),
              alpha_keys=False),
    variants=(Variant("v4", "Ideogram 4 (diffusers layout)", (REPO,), PARTS),),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="linear", quantize=True),
    examples=Examples("train_lora_ideogram4_tiny_cpu.yaml",
                      "train_lora_ideogram4_24gb.yaml"),
    quantizes_while_loading=True,
)

DESCRIPTIONS = (IDEOGRAM4,)
