"""The `example` arch described without torch (aitk.models.description): aitk's own tiny
DiT, for learning the toolkit and for tests."""

from __future__ import annotations

from typing import Literal

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


class ExampleKwargs(ArchKwargs):
    attention_backend: Literal["native", "flash"] = Field(
        "native", description="attention kernel: native (PyTorch SDPA) or flash "
                              "(needs flash-attn)")


EXAMPLE = ArchDescription(
    name="example",
    summary="aitk's tiny example model: trains in about a minute on a CPU",
    model_class="aitk.models.example.model:ExampleModel",
    quantizes_while_loading=True,
    size_multiple=8,  # VAE 4 x patch 2
    capabilities=Capabilities(),
    schedule=Schedule("flowmatch", FLOWMATCH_SCHEDULERS),
    model_kwargs=ExampleKwargs,
    lora=Lora(LoraKeys("diffusion_model.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),
              (LoraKeys("transformer.", ModuleNames.DIFFUSERS, KeyStyle.PEFT),),
              ("aitk",)),
    variants=(Variant("base", "the shipped base model (aitk/models/example/base)",
                      ("aitk/models/example/base",),
                      (Part("transformer", PartRole.DENOISER, 673_360, blocks=3,
                            block_params=614_304),
                       Part("text_encoder", PartRole.TEXT_ENCODER, 106_848),
                       Part("vae", PartRole.VAE, 60_223, float32=True))),),
    defaults=Defaults(resolution=(64,), steps=300, rank=16, alpha=16, lr=3e-3,
                      timestep_type="linear", quantize=False),
    examples=Examples("train_lora_example_cpu.yaml", None),
)

DESCRIPTIONS = (EXAMPLE,)
