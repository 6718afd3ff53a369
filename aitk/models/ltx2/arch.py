"""LTX-2 described without torch (aitk.models.description): `ltx2`, Lightricks' 19B
joint video-and-audio transformer with a Gemma 3 12B text encoder."""

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

# `diffusion_model.` + Lightricks' module names, which are diffusers' for every adapted
# Linear (aitk.models.ltx2.lora_keys); no `.alpha` keys: diffusers refuses them, so the
# scale is folded into the up weights. Reads `transformer.` + diffusers names too.
LORA = Lora(LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
            (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),),
            ("diffusers LTX2Pipeline.load_lora_weights", "ComfyUI (LTXAV)"),
            alpha_keys=False)

LTX2 = ArchDescription(
    name="ltx2",
    summary="LTX-2: Lightricks' 19B video model with a sound stream (do_audio trains it)",
    model_class="aitk.models.ltx2.model:LTX2Model",
    quantizes_while_loading=True,
    size_multiple=32,  # VAE 32 x patch 1
    # The transformer makes sound too: a `do_audio` dataset's clips train it with their
    # audio track (LTX2Model.encode_audio / side_loss); a clip without one trains video.
    capabilities=Capabilities(video=Frames(8), audio=True),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=ArchKwargs,
    lora=LORA,
    variants=(Variant("2.0", "LTX-2 19B dev", ("Lightricks/LTX-2",), (
        Part("transformer", PartRole.DENOISER, 18_876_174_592, blocks=48,
             block_params=18_531_581_952),
        Part("text_encoder", PartRole.TEXT_ENCODER, 12_202_563_392),
        Part("connectors", PartRole.TEXT_ENCODER, 1_431_475_200),
        Part("vae", PartRole.VAE, 1_222_479_601, float32=True),
        Part("audio_vae", PartRole.VAE, 53_248_146, float32=True),
        Part("vocoder", PartRole.VAE, 55_592_802, float32=True))),),
    defaults=Defaults(resolution=(512, 768), steps=2000, rank=32, alpha=32, lr=1e-4,
                      timestep_type="weighted", quantize=True),
    examples=Examples("train_lora_ltx2_tiny_cpu.yaml", "train_lora_ltx2_24gb.yaml"),
)

DESCRIPTIONS = (LTX2,)
