"""The `hidream` arch described without torch (aitk.models.description): HiDream-I1,
HiDream.ai's 17B sparse (mixture-of-experts) diffusion transformer with four text
encoders (two long-context CLIPs, T5-XXL and Llama 3.1 8B Instruct) and FLUX.1's VAE;
Full, and the guidance-distilled Dev and Fast."""

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

LLAMA_REPO = "unsloth/Meta-Llama-3.1-8B-Instruct"  # upstream's default (ungated copy)


class HiDreamKwargs(ArchKwargs):
    llama_model_path: str | None = Field(
        None, min_length=1, description="where text_encoder_4 (Llama 3.1 8B Instruct) "
                                        "loads from (default: the model folder's "
                                        f"text_encoder_4/, else {LLAMA_REPO}, as upstream)")
    max_sequence_length: int | None = Field(
        None, ge=1, description="T5 and Llama tokens per prompt (default 128, what "
                                "HiDreamImagePipeline and upstream use)")


# Counts: the real configs built on the meta device (the folder's real_parts.py).
# 16 double-stream + 32 single-stream blocks (4 routed experts, 2 active, + 1 shared
# each) and the 49 caption projections: the top-level ModuleLists.
TRANSFORMER = Part("transformer", PartRole.DENOISER, 17_105_733_184, blocks=97,
                   block_params=17_073_274_880)
# The two CLIPs are long-context variants whose position count was not readable here
# (the pipeline tokenizes them to 128): unknown, not a guess.
CLIP_L = Part("text_encoder", PartRole.TEXT_ENCODER, None)
CLIP_G = Part("text_encoder_2", PartRole.TEXT_ENCODER, None)
T5_XXL = Part("text_encoder_3", PartRole.TEXT_ENCODER, 4_762_310_656)
LLAMA = Part("text_encoder_4", PartRole.TEXT_ENCODER, 7_504_924_672)  # LlamaModel (no LM head)
VAE = Part("vae", PartRole.VAE, 83_819_683, float32=True)  # FLUX.1's VAE
PARTS = (TRANSFORMER, CLIP_L, CLIP_G, T5_XXL, LLAMA, VAE)

HIDREAM = ArchDescription(
    name="hidream",
    summary="HiDream-I1 Full, Dev and Fast: HiDream.ai's 17B mixture-of-experts transformer",
    model_class="aitk.models.hidream.model:HiDreamModel",
    size_multiple=16,  # VAE 8 x 2x2 patches
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=HiDreamKwargs,
    # `transformer.` + diffusers names (= ComfyUI's HiDream names), scale folded into
    # lora_B (aitk.adapters.alpha_folding): diffusers' HiDream loader refuses `.alpha`.
    lora=Lora(LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
              (LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),),
              ("diffusers HiDreamImagePipeline.load_lora_weights", "ComfyUI"),
              alpha_keys=False),
    variants=(
        Variant("full", "HiDream-I1 Full (true CFG, 50 steps)", ("HiDream-ai/HiDream-I1-Full",),
                PARTS),
        Variant("dev", "HiDream-I1 Dev (guidance-distilled, 28 steps)",
                ("HiDream-ai/HiDream-I1-Dev",), PARTS),
        Variant("fast", "HiDream-I1 Fast (guidance-distilled, 16 steps)",
                ("HiDream-ai/HiDream-I1-Fast",), PARTS),
    ),
    defaults=Defaults(resolution=(512, 768, 1024), steps=3000, rank=32, alpha=32, lr=2e-4,
                      timestep_type="shift", quantize=True),
    examples=Examples("train_lora_hidream_tiny_cpu.yaml", "train_lora_hidream_48gb.yaml"),
)

DESCRIPTIONS = (HIDREAM,)
