"""The batch that flows from the data loader through the BaseModel hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from aitk.models.prompt_embeds import AdvancedPromptEmbeds


@dataclass
class DataBatch:
    """One training batch.

    tensor:   pixels (B, 3, H, W) in [-1, 1] (video archs: (B, 3, F, H, W)); None when
              latents come from the cache.
    latents:  clean latents (B, C, h, w) (video archs: (B, C, f, h, w)), filled from the
              cache or `encode_images`.
    captions: one caption per item, after trigger/dropout processing.
    prompt_embeds: filled from the text-embed cache or `get_prompt_embeds`.
    control_tensor_list: edit models, one (B, 3, H, W) tensor in [0, 1] per control
    folder, in order (aitk.data.controls); control_tensor: the first of them.
    original_sizes: per item, the source image's (height, width) before the bucket resize;
    crop_coords_top_left: per item, the bucket crop's (top, left) in the resized image.
    SDXL conditions on both (its `time_ids`); None when unknown (no resize, no crop).
    crops:    per item, the resize and crop its pixels got (aitk.data.buckets.ResizeCrop;
              a random_crop draw), which its mask follows; None: each item's centre crop.
    items:    the dataset items (aitk.data.dataset.Item) the batch was made from.
    mask:     loss masks (B, 1, H, W) in [0, 1] at the bucket (aitk.data.masks); None when
              no dataset has masks.
    loss_weights: per item, how much its loss counts (a dataset's `loss_multiplier`,
    times `train.reg_weight` for a regularization dataset); None: all 1.
    prior_reg: a `prior_reg` dataset's batch: the target is the base model's prediction.
    audio_latents: archs that train sound (`do_audio`): per item, its soundtrack's
    latents (BaseModel.encode_audio) or None for a clip without one (it trains video
    only); None when no item of the batch has sound.
    network_weight: its dataset's `network_weight`: the adapter's strength for this batch
    (aitk.run.objectives.network_weight).
    prompt_blanks: `train.prompt_dropout_prob`'s draw (aitk.data.captions.dropped_prompts):
    per item, per text encoder, whether `prompt_embeds` hold that encoder's embedding of
    "" instead of the caption's; None when nothing was drawn (p = 0, or cached embeds).
    preservation_blanks: the same, drawn afresh for the batch's diff_output_preservation
    prompts (aitk.run.objectives.Preservation), as upstream encodes them with dropout too.
    """

    captions: list[str]
    tensor: torch.Tensor | None = None
    latents: torch.Tensor | None = None
    prompt_embeds: AdvancedPromptEmbeds | None = None
    control_tensor: torch.Tensor | None = None
    control_tensor_list: list[torch.Tensor] | None = None
    file_paths: list[str] = field(default_factory=list)
    original_sizes: list[tuple[int, int]] | None = None
    crop_coords_top_left: list[tuple[int, int]] | None = None
    crops: list[Any] | None = None
    items: list[Any] = field(default_factory=list)
    mask: torch.Tensor | None = None
    loss_weights: list[float] | None = None
    prior_reg: bool = False
    audio_latents: list[torch.Tensor | None] | None = None
    network_weight: float = 1.0
    prompt_blanks: tuple[tuple[bool, ...], ...] | None = None
    preservation_blanks: tuple[tuple[bool, ...], ...] | None = None

    def weigh(self, weights: torch.Tensor | None) -> torch.Tensor | None:
        """Per-item loss weights (B,): the schedule's `weights` times `loss_weights`."""
        if self.loss_weights is None:
            return weights
        mine = torch.tensor(self.loss_weights, dtype=torch.float32)
        return mine if weights is None else weights.float() * mine.to(weights.device)

    def __len__(self) -> int:
        return len(self.captions)
