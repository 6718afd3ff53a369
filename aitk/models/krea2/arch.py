"""The `krea2` arch described without torch (aitk.models.description): Krea 2, a 12.8B
single-stream MMDiT conditioned on 12 tapped hidden-state layers of Qwen3-VL-4B, with
Qwen-Image's VAE.

Two releases share the shapes, told apart by upstream's `arch:` tags (its web UI's
choices; `arch: krea2:turbo` fills in what that choice does, see `tag_defaults`):

- `raw` (plain `krea2`): Krea 2 Raw, the undistilled model (about 25 steps with CFG).
- `turbo`: Krea 2 Turbo, step-distilled (about 8 steps, no CFG). Trained through ostris'
  de-distillation adapter, merged into the frozen weights at load
  (`model.assistant_lora_path`, aitk.models.assistant) and taken out for previews.

Upstream's edit training (`model_kwargs.edit`, its `krea2:o_edit` tags) conditions on
reference latents through a transformer of its own; diffusers' Krea2Transformer2DModel
and Krea2Pipeline have no reference input, so it is refused with one line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

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


class Krea2Kwargs(ArchKwargs):
    max_text_length: int | None = Field(
        None, ge=1, description="prompt tokens after the template's system prefix "
                                "(default 512, upstream's and the pipeline's)")
    # Upstream's edit training, pinned off: its web UI's `krea2:o_edit` jobs set it.
    edit: Literal[False] = Field(False, description="upstream's reference-image edit "
                                                    "training: not supported")

    @field_validator("edit", mode="before")
    @classmethod
    def _no_edit(cls, value: object) -> object:
        if value:
            raise ValueError("Krea 2 edit training is not supported: diffusers' Krea 2 "
                             "transformer and pipeline take no reference images; drop "
                             "model_kwargs.edit to train text to image")
        return value


RAW_REPO = "krea/Krea-2-Raw"
TURBO_REPO = "krea/Krea-2-Turbo"
# ostris/krea2_turbo_training_adapter, as upstream's web UI fills it in for `krea2:turbo`.
TURBO_ADAPTER = ("ostris/krea2_turbo_training_adapter/"
                 "krea2_turbo_training_adapter_v1.safetensors")

# Counts: the real configs built on the meta device (the folder's real_parts.py).
# 28 transformer blocks; the text fusion's 4 blocks sit inside `text_fusion`.
TRANSFORMER = Part("transformer", PartRole.DENOISER, 12_820_073_036, blocks=28,
                   block_params=12_156_476_416)
# Qwen3-VL-4B-Instruct as Qwen3VLModel (no LM head); text to image drops its vision tower.
TEXT_ENCODER = Part("text_encoder", PartRole.TEXT_ENCODER, 4_437_815_808,
                    kept_params=4_022_468_096)
VAE = Part("vae", PartRole.VAE, 126_892_531, float32=True)  # Qwen-Image's
PARTS = (TRANSFORMER, TEXT_ENCODER, VAE)

# `diffusion_model.` + Krea's own module names (blocks.N.attn.wq, ...), no alpha keys
# (alpha folded into the up weights): what Krea's checkpoints and ComfyUI name, and
# what diffusers' Krea2Pipeline.load_lora_weights converts (it refuses `.alpha` keys).
LORA_KEYS = LoraKeys("diffusion_model.", ModuleNames.ORIGINAL, KeyStyle.PEFT)
LORA_READS = (LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
              LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT))

KREA2 = ArchDescription(
    name="krea2",
    summary="Krea 2: Krea's 12.8B text-to-image model (Raw, Turbo; Qwen3-VL text encoder)",
    model_class="aitk.models.krea2.model:Krea2Model",
    size_multiple=16,  # VAE 8 x 2x2 patches (upstream's bucket divisibility)
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=Krea2Kwargs,
    lora=Lora(LORA_KEYS, LORA_READS, ("diffusers Krea2Pipeline.load_lora_weights",
                                      "ComfyUI"), alpha_keys=False),
    variants=(
        Variant("raw", "Krea 2 Raw, undistilled", (RAW_REPO,), PARTS,
                tag_defaults=(("model.name_or_path", RAW_REPO),)),
        Variant("turbo", "Krea 2 Turbo, step-distilled (trained with its training adapter)",
                (TURBO_REPO,), PARTS,
                tag_defaults=(("model.name_or_path", TURBO_REPO),
                              ("model.assistant_lora_path", TURBO_ADAPTER),
                              ("sample.guidance_scale", 1.0),
                              ("sample.sample_steps", 9))),
    ),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="linear", quantize=True),
    examples=Examples("train_lora_krea2_tiny_cpu.yaml", "train_lora_krea2_24gb.yaml"),
)

DESCRIPTIONS = (KREA2,)
