"""The example model's shapes: what `build_example_model` makes and `ExampleModel`
reads. A module of its own so that neither of those two imports the other."""

from __future__ import annotations

from dataclasses import dataclass

# Tokens per prompt (ByT5: one per UTF-8 byte).
MAX_TOKENS = 128


@dataclass(frozen=True)
class ExampleSizes:
    """Small enough that a training step on a 2-core CPU takes a fraction of a second."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    patch_size: int = 2
    latent_channels: int = 4
    text_dim: int = 64
    text_layers: int = 2
    vae_channels: tuple[int, ...] = (16, 32, 32)  # 3 levels: scale factor 4
    vae_attention: bool = True  # the VAE's mid-block self-attention
    vae_norm_groups: int = 8


# Sizes for `pretrain=`: a VAE without mid-block attention and with narrower convs
# pre-trains several times faster; one norm group keeps the channels' relative levels
# (the colour of a flat region), which per-channel groups normalise away, so it learns
# colours sooner. A wider, deeper transformer than the test model's: at 64 wide and 2
# deep it drew blobs and ignored the prompt after the same pre-training.
PRETRAINED_SIZES = ExampleSizes(hidden_size=96, num_layers=3, vae_channels=(8, 16, 16),
                                vae_attention=False, vae_norm_groups=1)
