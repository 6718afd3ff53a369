"""The Wan 2.1 archs described without torch (aitk.models.description): `wan21` (text
to video, 1.3B and 14B) and `wan21_i2v` (image to video). Wan 2.2 14B (aitk.models.wan22)
builds on them."""

from __future__ import annotations

from aitk.models.description import (
    FLOWMATCH_SCHEDULERS,
    ArchDescription,
    ArchKwargs,
    Capabilities,
    Defaults,
    Examples,
    Frames,
    KeyStyle,
    Lora,
    LoraKeys,
    ModuleNames,
    Part,
    PartRole,
    Schedule,
    Variant,
)

WAN_FRAMES = Frames(4)  # the causal VAE: the first frame alone, then 4 per latent frame
UMT5_XXL = Part("text_encoder", PartRole.TEXT_ENCODER, 5_680_910_336)
VAE = Part("vae", PartRole.VAE, 126_892_531, float32=True)
TRANSFORMER_14B = Part("transformer", PartRole.DENOISER, 14_288_491_584, blocks=40,
                       block_params=14_055_772_160)
FLOW_MATCHING = Schedule("flowmatch", FLOWMATCH_SCHEDULERS)

# Original Wan names with `diffusion_model.` (ComfyUI's; diffusers converts them); read
# back also as diffusers names under `transformer.` or aitk's older `diffusion_model.`.
LORA_KEYS = LoraKeys("diffusion_model.", ModuleNames.ORIGINAL, KeyStyle.PEFT)
LORA_READS = (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
              LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT))

WAN21 = ArchDescription(
    name="wan21",
    summary="Wan 2.1: Alibaba's open text-to-video model, 1.3B or 14B",
    model_class="aitk.models.wan21.model:Wan21Model",
    quantizes_while_loading=True,
    size_multiple=16,  # VAE 8 x patch 2
    capabilities=Capabilities(video=WAN_FRAMES),
    schedule=FLOW_MATCHING,
    model_kwargs=ArchKwargs,
    lora=Lora(LORA_KEYS, LORA_READS, ("diffusers WanPipeline.load_lora_weights", "ComfyUI")),
    variants=(
        Variant("1b", "Wan 2.1 T2V 1.3B", ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",),
                (Part("transformer", PartRole.DENOISER, 1_418_996_800, blocks=30,
                      block_params=1_393_221_120), UMT5_XXL, VAE)),
        Variant("14b", "Wan 2.1 T2V 14B", ("Wan-AI/Wan2.1-T2V-14B-Diffusers",),
                (TRANSFORMER_14B, UMT5_XXL, VAE)),
    ),
    defaults=Defaults(resolution=(512, 768), steps=2000, rank=32, alpha=32, lr=1e-4,
                      timestep_type="sigmoid", quantize=False),
    examples=Examples("train_lora_wan21_tiny_cpu.yaml", "train_lora_wan21_24gb.yaml"),
)

WAN21_I2V = ArchDescription(
    name="wan21_i2v",
    summary="Wan 2.1 image to video (14B): a clip that starts from a given picture",
    model_class="aitk.models.wan21.model:Wan21I2VModel",
    quantizes_while_loading=True,
    size_multiple=16,
    capabilities=Capabilities(video=WAN_FRAMES, first_frame=True),
    schedule=FLOW_MATCHING,
    model_kwargs=ArchKwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers WanImageToVideoPipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("14b480p", "Wan 2.1 I2V 14B 480P",
                      ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",),
                      (Part("transformer", PartRole.DENOISER, 16_394_878_784, blocks=40,
                            block_params=16_153_538_560), UMT5_XXL, VAE,
                       Part("image_encoder", PartRole.IMAGE_ENCODER, 630_766_080))),),
    defaults=Defaults(resolution=(512, 768), steps=2000, rank=32, alpha=32, lr=1e-4,
                      timestep_type="sigmoid", quantize=False),
    # Real weights: the wan21 24 GB example with `arch: wan21_i2v` and the I2V weights.
    examples=Examples("train_lora_wan21_i2v_tiny_cpu.yaml", "train_lora_wan21_24gb.yaml"),
)

DESCRIPTIONS = (WAN21, WAN21_I2V)
