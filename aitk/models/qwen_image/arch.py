"""The `qwen_image` arch described without torch (aitk.models.description): Qwen-Image,
a 20B MMDiT with a Qwen2.5-VL text encoder. qwen_image_edit builds on it."""

from __future__ import annotations

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

TRANSFORMER = Part("transformer", PartRole.DENOISER, 20_430_401_088, blocks=60,
                   block_params=20_389_877_760)
# Qwen2.5-VL-7B; text to image drops its vision tower at load (kept_params).
TEXT_ENCODER = Part("text_encoder", PartRole.TEXT_ENCODER, 8_292_166_656,
                    kept_params=7_615_616_512)
VAE = Part("vae", PartRole.VAE, 126_892_531, float32=True)

LORA_KEYS = LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT)
LORA_READS = (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),)

QWEN_IMAGE = ArchDescription(
    name="qwen_image",
    summary="Qwen-Image: Alibaba's 20B text-to-image model (Qwen2.5-VL text encoder)",
    model_class="aitk.models.qwen_image.model:QwenImageModel",
    quantizes_while_loading=True,
    size_multiple=32,  # VAE 8 x 2x2 packing, x 2 as upstream buckets it
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=ArchKwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers QwenImagePipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("default", "Qwen-Image", ("Qwen/Qwen-Image",),
                      (TRANSFORMER, TEXT_ENCODER, VAE)),),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="shift", quantize=True),
    examples=Examples("train_lora_qwen_image_tiny_cpu.yaml", "train_lora_qwen_image_24gb.yaml"),
)

DESCRIPTIONS = (QWEN_IMAGE,)
