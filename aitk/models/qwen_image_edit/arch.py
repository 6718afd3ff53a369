"""The Qwen-Image-Edit archs described without torch (aitk.models.description):
`qwen_image_edit` (one control image) and `qwen_image_edit_plus` (up to three), on
qwen_image's parts; the text encoder keeps its vision tower (the prompt sees the
controls)."""

from __future__ import annotations

from pydantic import Field

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
from aitk.models.qwen_image.arch import LORA_KEYS, LORA_READS, QWEN_IMAGE, TRANSFORMER, VAE

TEXT_ENCODER = Part("text_encoder", PartRole.TEXT_ENCODER, 8_292_166_656)  # vision tower kept


class EditPlusKwargs(ArchKwargs):
    match_target_res: bool = Field(
        False, description="encode each control at the training image's area instead of "
                           "about 1 MP (cheaper; previews follow)")


EDIT_DEFAULTS = Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                         timestep_type="shift", quantize=True)

QWEN_IMAGE_EDIT = ArchDescription(
    name="qwen_image_edit",
    summary="Qwen-Image-Edit: edits an image as a prompt says (pairs of control and target "
            "images)",
    model_class="aitk.models.qwen_image_edit.model:QwenImageEditModel",
    quantizes_while_loading=True,
    size_multiple=32,
    capabilities=Capabilities(control_images=1),
    schedule=QWEN_IMAGE.schedule,
    model_kwargs=ArchKwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers QwenImageEditPipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("default", "Qwen-Image-Edit", ("Qwen/Qwen-Image-Edit",),
                      (TRANSFORMER, TEXT_ENCODER, VAE)),),
    defaults=EDIT_DEFAULTS,
    examples=Examples("train_lora_qwen_image_edit_tiny_cpu.yaml",
                      "train_lora_qwen_image_edit_24gb.yaml"),
)

QWEN_IMAGE_EDIT_PLUS = ArchDescription(
    name="qwen_image_edit_plus",
    summary="Qwen-Image-Edit-2509: edits with up to three reference images",
    model_class="aitk.models.qwen_image_edit.model:QwenImageEditPlusModel",
    quantizes_while_loading=True,
    size_multiple=32,
    capabilities=Capabilities(control_images=3),
    schedule=QWEN_IMAGE.schedule,
    model_kwargs=EditPlusKwargs,
    lora=Lora(LORA_KEYS, LORA_READS,
              ("diffusers QwenImageEditPlusPipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("2509", "Qwen-Image-Edit-2509", ("Qwen/Qwen-Image-Edit-2509",),
                      (TRANSFORMER, TEXT_ENCODER, VAE)),),
    defaults=EDIT_DEFAULTS,
    examples=Examples("train_lora_qwen_image_edit_plus_tiny_cpu.yaml",
                      "train_lora_qwen_image_edit_plus_24gb.yaml"),
)

DESCRIPTIONS = (QWEN_IMAGE_EDIT, QWEN_IMAGE_EDIT_PLUS)
