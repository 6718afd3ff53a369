"""Build a tiny `example` model folder, with no download.

Every part is created from a small config under `torch.manual_seed(seed)` and written
with its own `save_pretrained`, so the folder loads through the same `from_pretrained`
calls as a real model. The same seed gives the same weights. With `pretrain=` the
random weights first go through the pre-training of aitk.models.example.pretrain (a
VAE and transformer that draw coloured shapes), recorded in `pretrain.json`. The
folder is assembled in a temporary sibling and published by one rename: it is complete
or absent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from aitk.models.example.pretrain import PretrainPlan
from aitk.models.example.sizes import MAX_TOKENS, PRETRAINED_SIZES, ExampleSizes
from aitk_common.files import staged_dir

# What a pre-trained folder records of how it was made (the shipped base has one).
RECIPE_FILE = "pretrain.json"


def pretrain_record(plan: PretrainPlan, sizes: ExampleSizes, seed: int) -> dict[str, Any]:
    """The inputs that decide a pre-trained model's weights (with the same torch on the
    same kind of CPU): the recipe, the sizes, the seed and a digest of the data."""
    from aitk.models.example.pretrain import training_data_digest

    return {"seed": seed, "plan": asdict(plan),
            "sizes": json.loads(json.dumps(asdict(sizes))),  # tuples as JSON lists
            "data_sha256": training_data_digest(plan, seed)}


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _refuse_non_empty(target: Path, overwrite: bool) -> None:
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty")


def build_example_model(target: Path, seed: int = 0, sizes: ExampleSizes | None = None,
                        overwrite: bool = False, pretrain: PretrainPlan | None = None,
                        report: Callable[[str], None] = _say) -> Path:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    from aitk.models.example.transformer import ExampleTransformer

    target = Path(target)
    _refuse_non_empty(target, overwrite)
    if sizes is None:
        sizes = PRETRAINED_SIZES if pretrain is not None else ExampleSizes()
    with staged_dir(target) as tmp:
        torch.manual_seed(seed)
        te_config = T5Config(
            vocab_size=384, d_model=sizes.text_dim, d_kv=sizes.text_dim // 4,
            d_ff=sizes.text_dim * 2, num_layers=sizes.text_layers, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=32,
            dropout_rate=0.0, feed_forward_proj="gated-gelu", is_encoder_decoder=False,
            use_cache=False)
        text_encoder = T5EncoderModel(te_config).eval()
        tokenizer = ByT5Tokenizer(model_max_length=MAX_TOKENS)

        n = len(sizes.vae_channels)
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=sizes.latent_channels,
            down_block_types=("DownEncoderBlock2D",) * n,
            up_block_types=("UpDecoderBlock2D",) * n,
            block_out_channels=sizes.vae_channels, layers_per_block=1,
            norm_num_groups=sizes.vae_norm_groups,
            sample_size=64, scaling_factor=1.0, mid_block_add_attention=sizes.vae_attention)

        transformer = ExampleTransformer(
            in_channels=sizes.latent_channels, patch_size=sizes.patch_size,
            hidden_size=sizes.hidden_size, num_layers=sizes.num_layers,
            num_heads=sizes.num_heads, text_dim=sizes.text_dim)

        if pretrain is not None:
            from aitk.models.example.pretrain import pretrain as run_pretraining

            run_pretraining(vae, transformer, text_encoder, tokenizer, pretrain, seed,
                            report, MAX_TOKENS)
            (tmp / RECIPE_FILE).write_text(
                json.dumps({**pretrain_record(pretrain, sizes, seed),
                            "torch": torch.__version__}, indent=2) + "\n",
                encoding="utf-8")
        text_encoder.save_pretrained(tmp / "text_encoder")
        tokenizer.save_pretrained(tmp / "tokenizer")
        vae.save_pretrained(tmp / "vae")
        transformer.save_pretrained(tmp / "transformer")

        FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0
                                        ).save_pretrained(tmp / "scheduler")
    return target
