"""Build a tiny random-initialised Chroma model folder, with no download.

The layout is the diffusers one (`ChromaPipeline.from_pretrained` reads it too):

    transformer/  ChromaTransformer2DModel (1 double + 1 single block, hidden 32, a
                  1-layer guidance approximator of width 32)
    text_encoder/ T5EncoderModel      tokenizer/  ByT5Tokenizer (bytes, no vocabulary)
    vae/          AutoencoderKL, 4 levels (scale factor 8), Flux's shift and scale
    scheduler/    FlowMatchEulerDiscreteScheduler with Flux's dynamic shift
    model_index.json

The T5, tokenizer and VAE come from the tiny Flux builder (aitk.models.flux.tiny), so
the two archs' tiny parts are the same. Each part is written with its own
`save_pretrained` under `torch.manual_seed(seed)`; the folder is published by one rename.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aitk.models.flux.tiny import FluxSizes, write_tiny_t5, write_tiny_vae
from aitk_common.files import staged_dir

MODEL_INDEX = {
    "_class_name": "ChromaPipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "ByT5Tokenizer"],
    "transformer": ["diffusers", "ChromaTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "image_encoder": [None, None],
    "feature_extractor": [None, None],
}


@dataclass(frozen=True)
class ChromaSizes(FluxSizes):
    approximator_num_channels: int = 16  # a multiple of 4: time, guidance, 2x mod index
    approximator_hidden_dim: int = 32
    approximator_layers: int = 1


def build_tiny_chroma(target: Path, seed: int = 0, sizes: ChromaSizes = ChromaSizes(),
                      overwrite: bool = False) -> Path:
    from diffusers import ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    target = Path(target)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        write_tiny_t5(tmp / "text_encoder", tmp / "tokenizer", sizes)
        write_tiny_vae(tmp / "vae", sizes)
        ChromaTransformer2DModel(
            patch_size=1, in_channels=sizes.latent_channels * 4,
            num_layers=sizes.num_layers, num_single_layers=sizes.num_single_layers,
            attention_head_dim=sizes.attention_head_dim,
            num_attention_heads=sizes.num_attention_heads,
            joint_attention_dim=sizes.text_dim, axes_dims_rope=sizes.axes_dims_rope,
            approximator_num_channels=sizes.approximator_num_channels,
            approximator_hidden_dim=sizes.approximator_hidden_dim,
            approximator_layers=sizes.approximator_layers,
        ).save_pretrained(tmp / "transformer")
        FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
            base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096,
        ).save_pretrained(tmp / "scheduler")
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return target
