"""The `flux2` arch described without torch (aitk.models.description): FLUX.2 [dev],
Black Forest Labs' 32B guidance-distilled transformer with Mistral Small 3.1 (24B) as its
text encoder and the FLUX.2 VAE. It edits too: up to three reference images
(`control_path` datasets, `ctrl_img` samples) join the image tokens, as diffusers'
Flux2Pipeline feeds them."""

from __future__ import annotations

from pydantic import Field

from aitk.models.description import (
    FLOWMATCH_SCHEDULERS,
    ArchDescription,
    ArchKwargs,
    Capabilities,
    Defaults,
    Examples,
    Lora,
    Part,
    PartRole,
    Schedule,
    Variant,
)
from aitk.models.flux2_klein.arch import FLUX2_KLEIN, VAE


class Flux2Kwargs(ArchKwargs):
    max_sequence_length: int | None = Field(
        None, ge=1, description="prompt tokens, system message included (default 512)")
    text_encoder_out_layers: tuple[int, ...] | None = Field(
        None, min_length=1, description="Mistral hidden states stacked per token "
                                        "(default 10, 20, 30)")
    shift_steps: int | None = Field(
        None, ge=1, description="sampling steps the `shift` timestep type's mu is taken at "
                                "(default 50)")
    match_target_res: bool = Field(
        False, description="encode each reference image at the training image's area "
                           "instead of at most 1 MP (cheaper; previews follow)")


# Counts: the real configs built on the meta device (the folder's real_parts.py).
# 8 double-stream + 48 single-stream blocks.
TRANSFORMER = Part("transformer", PartRole.DENOISER, 32_223_281_152, blocks=56,
                   block_params=31_406_964_736)
# Mistral Small 3.1: only its language model is loaded, and of it only the layers up to
# the deepest one read (31 of 40) and no LM head (kept_params); no vision tower.
TEXT_ENCODER = Part("text_encoder", PartRole.TEXT_ENCODER, 24_011_361_280,
                    kept_params=17_899_514_880)

FLUX2 = ArchDescription(
    name="flux2",
    summary="FLUX.2 [dev]: Black Forest Labs' 32B model, text to image or editing up to "
            "3 references",
    model_class="aitk.models.flux2.model:Flux2Model",
    quantizes_while_loading=True,
    size_multiple=16,  # VAE 8 x 2x2 patchified latents
    capabilities=Capabilities(control_images=3),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=Flux2Kwargs,
    # klein's: kohya names over BFL's modules (what ComfyUI maps), read back in its
    # other layouts too.
    lora=Lora(FLUX2_KLEIN.lora.writes, FLUX2_KLEIN.lora.reads,
              ("diffusers Flux2Pipeline.load_lora_weights", "ComfyUI")),
    variants=(Variant("dev", "FLUX.2 [dev], guidance-distilled (non-commercial license)",
                      ("black-forest-labs/FLUX.2-dev",), (TRANSFORMER, TEXT_ENCODER, VAE)),),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=16, alpha=16, lr=1e-4,
                      timestep_type="weighted", quantize=True),
    examples=Examples("train_lora_flux2_tiny_cpu.yaml", "train_lora_flux2_48gb.yaml"),
)

DESCRIPTIONS = (FLUX2,)
