"""What the UNet archs (sd1, sd2, sdxl) share: diffusers' UNet2DConditionModel over an
AutoencoderKL with CLIP text encoders, trained with DDPM noise, LoRA in kohya's names.

`UNetModel` holds what is the same for all of them, each arch's model adds its loading,
its prompt embeds, the UNet call and its preview pipeline:

- latents: the VAE posterior's mean * scaling_factor (aitk.models.kl_latents), the VAE
  in float32 (SDXL's overflows in float16; SD 1.x/2.x's is the same AutoencoderKL);
- training: DDPM noise (aitk.diffusion.ddpm) over the scheduler config's betas with its
  prediction type, `model.is_v_pred` overriding it (`prediction_overrides`); integer
  steps 0..999 are already the UNet's own timesteps; Min-SNR from `train.min_snr_gamma`;
- LoRA: the Linear layers of the UNet blocks' attention (Transformer2DModel) modules, as
  kohya and upstream train, and with `train.train_text_encoder` those of each CLIP
  encoder's layers; files in the arch's kohya layout (aitk.models.kohya);
- image sides: multiples of the VAE factor x the UNet's downsampling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from torch import nn

from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.models import kl_latents, kohya
from aitk.models.base import BaseModel

# Kept in float by quantization: the input/time/added-condition embedders and the output.
UNET_QUANT_EXCLUDE = ("conv_in", "time_embedding*", "add_embedding*", "conv_norm_out",
                      "conv_out")
TE_QUANT_EXCLUDE = ("*embeddings*", "text_projection")
BLOCK_ROOTS = ("down_blocks", "mid_block", "up_blocks")


def prediction_overrides(model_config: Any) -> dict[str, str]:
    """The scheduler-config override `model.is_v_pred` asks for (none when unset: the
    model's scheduler config says)."""
    v_pred = getattr(model_config, "is_v_pred", None)
    if v_pred is None:
        return {}
    return {"prediction_type": "v_prediction" if v_pred else "epsilon"}


def attention_prefixes(unet: nn.Module) -> tuple[str, ...]:
    """`down_blocks.1.attentions.`, `mid_block.attentions.`, ...: the transformer
    modules of the UNet's blocks, whose Linear layers (attention, feed-forward, the
    linear in/out projections) LoRA trains."""
    prefixes = []
    for name, _ in unet.named_modules():
        parts = name.split(".")
        if parts[-1] == "attentions" and parts[0] in BLOCK_ROOTS:
            prefixes.append(name + ".")
    return tuple(prefixes)


def tensor_to_pil(pixels: torch.Tensor) -> Image.Image:
    """(3, H, W) in [-1, 1] -> RGB PIL image."""
    arr = ((pixels.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return Image.fromarray(np.ascontiguousarray(arr.permute(1, 2, 0).cpu().numpy()), "RGB")


class UNetModel(BaseModel):
    """The shared half of the UNet archs; a subclass loads `self.model` (the UNet),
    `self.vae`, `self.noise_scheduler` and its text encoders (attributes named as
    their subfolders in `text_encoder_subfolders`), and sets `kohya_layout`."""

    use_old_lokr_format = False
    # The UNet's blocks; load_model narrows these to the attention (Transformer2DModel)
    # modules inside them (attention_prefixes).
    lora_block_prefixes = tuple(f"{root}." for root in BLOCK_ROOTS)
    # LoCon (`network.conv`): the Conv2d layers of the same blocks (ResNets, down- and
    # upsamplers), as kohya's networks train them.
    lora_conv_prefixes = tuple(f"{root}." for root in BLOCK_ROOTS)
    supports_dora = True  # kohya's layout keeps each layer's dora_scale (aitk.models.kohya)
    text_encoder_lora_prefixes = kohya.CLIP_LORA_PREFIXES
    text_encoder_subfolders: ClassVar[tuple[str, ...]] = ("text_encoder",)
    kohya_layout: ClassVar[kohya.KohyaLayout]
    denoiser_subfolders: ClassVar[tuple[str, ...]] = ("unet",)

    # ---- latents ---------------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> latents (B, 4, H/8, W/8) * scaling_factor.

        The distribution's mean, not a sample: cached latents are then deterministic.
        """
        with self.on_device(self.vae):
            latents = kl_latents.encode(self.vae, images, self.device)
        return latents.to(self.device, self.dtype)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        with self.on_device(self.vae):
            return kl_latents.decode(self.vae, latents, self.device)

    def get_bucket_divisibility(self) -> int:
        """VAE factor x the UNet's downsampling (each down block but the last halves
        the latent): SD 1.x/2.x 8 x 8 = 64 px, SDXL 8 x 4 = 32 px."""
        return self.vae_scale_factor * 2 ** (len(self.model.config.down_block_types) - 1)

    # ---- training ----------------------------------------------------------------------
    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        from aitk.diffusion.ddpm import DDPMSchedule

        # The loaded scheduler already carries `is_v_pred`'s override.
        return DDPMSchedule.from_config(self.noise_scheduler.config, settings)

    @staticmethod
    def unet_timesteps(timestep: torch.Tensor, batch: int, device: torch.device
                       ) -> torch.Tensor:
        """(B,) steps for the UNet: DDPM steps 0..999 (999 = noise) are already its own."""
        t = torch.as_tensor(timestep, device=device).reshape(-1)
        return t.expand(batch) if t.numel() == 1 else t

    # ---- text-encoder LoRA -------------------------------------------------------------
    def text_encoder_parts(self) -> dict[str, nn.Module]:
        return {sub: module for sub in self.text_encoder_subfolders
                if (module := getattr(self, sub, None)) is not None}

    # ---- LoRA files --------------------------------------------------------------------
    def extraction_targets(self, weights: Mapping[str, Sequence[int]],
                           conv: bool = False) -> list[str]:
        """What training targets (the Linear layers of the blocks' attention modules),
        read from the names as attention_prefixes reads the loaded UNet; with `conv` the
        convolutions of the UNet (resnets, up/down samplers, conv_in/out) too, as
        LyCORIS's LoCon extraction takes them. All have kohya names ComfyUI maps."""
        out = []
        for name, shape in weights.items():
            if not name.endswith(".weight"):
                continue
            layer, parts = name[: -len(".weight")], name.split(".")
            in_blocks = parts[0] in BLOCK_ROOTS
            if len(shape) == 2 and in_blocks and "attentions" in parts:
                out.append(layer)
            elif conv and len(shape) == 4 and (in_blocks or parts[0] in ("conv_in",
                                                                         "conv_out")):
                out.append(layer)
        return sorted(out)

    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        return kohya.to_kohya(state_dict, self.kohya_layout)

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        names = [n for n, _ in self.get_model_to_train().named_modules()]
        encoders = ({part: [n for n, _ in module.named_modules()]
                     for part, module in self.text_encoder_parts().items()}
                    if self.text_encoder_trains else None)
        return kohya.from_files(state_dict, self.kohya_layout, names, encoders)
