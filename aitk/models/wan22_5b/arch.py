"""Wan 2.2 TI2V 5B described without torch (aitk.models.description): `wan22_5b`, one
5B transformer on the Wan 2.2 VAE, on the Wan 2.1 code (its prompts, schedule and LoRA
layout are Wan 2.1's)."""

from __future__ import annotations

from aitk.models.description import (
    ArchDescription,
    ArchKwargs,
    Capabilities,
    Defaults,
    Examples,
    Lora,
    Part,
    PartRole,
    Variant,
)
from aitk.models.wan21.arch import FLOW_MATCHING, LORA_KEYS, LORA_READS, UMT5_XXL, WAN_FRAMES

WAN22_5B = ArchDescription(
    name="wan22_5b",
    summary="Wan 2.2 TI2V 5B: one 5B transformer for text (or a first frame) to video",
    model_class="aitk.models.wan22_5b.model:Wan22_5BModel",
    quantizes_while_loading=True,
    size_multiple=32,  # VAE 16 (2x2 patchify, then 8x) x patch 2
    # Training is text to video; image to video is a preview with `ctrl_img`.
    capabilities=Capabilities(video=WAN_FRAMES),
    schedule=FLOW_MATCHING,
    model_kwargs=ArchKwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers WanPipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("ti2v", "Wan 2.2 TI2V 5B", ("Wan-AI/Wan2.2-TI2V-5B-Diffusers",),
                      (Part("transformer", PartRole.DENOISER, 4_999_787_712, blocks=30,
                            block_params=4_909_701_120),
                       UMT5_XXL, Part("vae", PartRole.VAE, 704_688_668, float32=True))),),
    defaults=Defaults(resolution=(512, 768), steps=2000, rank=32, alpha=32, lr=1e-4,
                      timestep_type="weighted", quantize=True),
    examples=Examples("train_lora_wan22_5b_tiny_cpu.yaml", "train_lora_wan22_5b_24gb.yaml"),
)

DESCRIPTIONS = (WAN22_5B,)
