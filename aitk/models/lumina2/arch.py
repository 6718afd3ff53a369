"""The `lumina2` arch described without torch (aitk.models.description): Lumina-Image
2.0, Alpha-VLLM's 2.6B unified (text and image tokens in one sequence) flow transformer
with a Gemma 2 2B text encoder and FLUX.1's VAE. Its native time runs the other way
(t = 1 is the clean image): the model converts at its boundary."""

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


class Lumina2Kwargs(ArchKwargs):
    max_sequence_length: int | None = Field(
        None, ge=1, description="Gemma tokens per prompt, system prompt included (default "
                                "256, what Lumina2Pipeline and upstream use)")
    system_prompt: str | None = Field(
        None, min_length=1, description="the text put before ' <Prompt Start> ' and each "
                                        "prompt (default Lumina2Pipeline's own)")


# Counts: the real configs built on the meta device (the folder's real_parts.py).
# 26 joint layers + 2 noise refiners + 2 context refiners.
TRANSFORMER = Part("transformer", PartRole.DENOISER, 2_609_769_152, blocks=30,
                   block_params=2_600_484_480)
GEMMA2_2B = Part("text_encoder", PartRole.TEXT_ENCODER, 2_614_341_888)
VAE = Part("vae", PartRole.VAE, 83_819_683, float32=True)  # FLUX.1's VAE

LUMINA2 = ArchDescription(
    name="lumina2",
    summary="Lumina-Image 2.0: Alpha-VLLM's 2.6B flow transformer with a Gemma 2 text encoder",
    model_class="aitk.models.lumina2.model:Lumina2Model",
    upstream_flags=("is_lumina2",),
    size_multiple=16,  # VAE 8 x 2x2 patches
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=Lumina2Kwargs,
    # The authors' NextDiT names, q/k/v fused, scale folded (aitk.models.lumina2.lora_keys).
    lora=Lora(LoraKeys("diffusion_model.", ModuleNames.ORIGINAL, KeyStyle.PEFT),
              (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
               LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)),
              ("diffusers Lumina2Pipeline.load_lora_weights", "ComfyUI"), alpha_keys=False),
    variants=(Variant("2.0", "Lumina-Image 2.0", ("Alpha-VLLM/Lumina-Image-2.0",),
                      (TRANSFORMER, GEMMA2_2B, VAE)),),
    defaults=Defaults(resolution=(512, 768, 1024), steps=2000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="lumina2_shift", quantize=False),
    examples=Examples("train_lora_lumina2_tiny_cpu.yaml", "train_lora_lumina2_24gb.yaml"),
)

DESCRIPTIONS = (LUMINA2,)
