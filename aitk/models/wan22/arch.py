"""The Wan 2.2 14B archs described without torch (aitk.models.description): `wan22_14b`
and `wan22_14b_i2v`, two 14B experts (high noise, low noise) on the Wan 2.1 code."""

from __future__ import annotations

from pydantic import Field, model_validator

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
from aitk.models.wan21.arch import (
    FLOW_MATCHING,
    LORA_KEYS,
    LORA_READS,
    TRANSFORMER_14B,
    UMT5_XXL,
    VAE,
    WAN_FRAMES,
)


class Wan22Kwargs(ArchKwargs):
    train_high_noise: bool = Field(True, description="train the high-noise expert "
                                                     "(transformer/)")
    train_low_noise: bool = Field(True, description="train the low-noise expert "
                                                    "(transformer_2/)")

    @model_validator(mode="after")
    def _one_expert_at_least(self) -> Wan22Kwargs:
        if not (self.train_high_noise or self.train_low_noise):
            raise ValueError("train_high_noise and train_low_noise are both false; train "
                             "at least one expert")
        return self


EXPERTS = ("transformer", "transformer_2")
# LoRA files: one per trained expert, upstream's names; a combined file with upstream's
# `diffusion_model.transformer_1.` / `transformer_2.` keys also loads.
FILES = ("_high_noise", "_low_noise")
I2V_EXPERT = Part("transformer", PartRole.DENOISER, 14_288_901_184, blocks=40,
                  block_params=14_055_772_160)  # 36 input channels: + first-frame condition

DEFAULTS = Defaults(resolution=(512, 768), steps=2000, rank=32, alpha=32, lr=1e-4,
                    timestep_type="linear", quantize=True)

WAN22_14B = ArchDescription(
    name="wan22_14b",
    summary="Wan 2.2 14B text to video: two 14B experts, for high and for low noise",
    model_class="aitk.models.wan22.model:Wan22Model",
    quantizes_while_loading=True,
    size_multiple=16,
    capabilities=Capabilities(video=WAN_FRAMES, experts=EXPERTS),
    schedule=FLOW_MATCHING,
    model_kwargs=Wan22Kwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers WanPipeline.load_lora_weights (load_into_transformer_2=True for "
               "the low-noise file)", "ComfyUI (one file per expert's model loader)"),
              files=FILES),
    variants=(Variant("t2v", "Wan 2.2 T2V A14B", ("Wan-AI/Wan2.2-T2V-A14B-Diffusers",),
                      (TRANSFORMER_14B, Part("transformer_2", PartRole.DENOISER,
                                             TRANSFORMER_14B.params, blocks=40,
                                             block_params=TRANSFORMER_14B.block_params),
                       UMT5_XXL, VAE)),),
    defaults=DEFAULTS,
    examples=Examples("train_lora_wan22_14b_tiny_cpu.yaml", "train_lora_wan22_14b_24gb.yaml"),
)

WAN22_14B_I2V = ArchDescription(
    name="wan22_14b_i2v",
    summary="Wan 2.2 14B image to video: two experts, the clip starts from a picture",
    model_class="aitk.models.wan22.model:Wan22I2VModel",
    quantizes_while_loading=True,
    size_multiple=16,
    capabilities=Capabilities(video=WAN_FRAMES, first_frame=True, experts=EXPERTS),
    schedule=FLOW_MATCHING,
    model_kwargs=Wan22Kwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers WanImageToVideoPipeline.load_lora_weights "
               "(load_into_transformer_2=True for the low-noise file)",
               "ComfyUI (one file per expert's model loader)"), files=FILES),
    variants=(Variant("i2v", "Wan 2.2 I2V A14B", ("Wan-AI/Wan2.2-I2V-A14B-Diffusers",),
                      (I2V_EXPERT, Part("transformer_2", PartRole.DENOISER, I2V_EXPERT.params,
                                        blocks=40, block_params=I2V_EXPERT.block_params),
                       UMT5_XXL, VAE)),),
    defaults=DEFAULTS,
    # Real weights: the wan22_14b 24 GB example with `arch: wan22_14b_i2v`.
    examples=Examples("train_lora_wan22_14b_i2v_tiny_cpu.yaml",
                      "train_lora_wan22_14b_24gb.yaml"),
)

DESCRIPTIONS = (WAN22_14B, WAN22_14B_I2V)
