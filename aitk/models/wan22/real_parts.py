"""The real, full-size configs of Wan 2.2 14B's parts (two experts) (the shapes only: no
weights), keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used
and checked."""

from __future__ import annotations

from aitk.models.real_parts import RealPart
from aitk.models.wan21.real_parts import UMT5_XXL, WAN_14B, WAN_VAE


def wan22_parts(in_channels: int, source: str) -> dict[str, RealPart]:
    expert = RealPart("diffusers", "WanTransformer3DModel",
                      {**WAN_14B, "in_channels": in_channels}, source)
    return {"transformer": expert, "transformer_2": expert, "text_encoder": UMT5_XXL,
            "vae": WAN_VAE}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("Wan-AI/Wan2.2-T2V-A14B-Diffusers", k): v for k, v in
       wan22_parts(16, "diffusers convert_wan_to_diffusers.py Wan2.2-T2V-A14B").items()},
    **{("Wan-AI/Wan2.2-I2V-A14B-Diffusers", k): v for k, v in
       wan22_parts(36, "diffusers convert_wan_to_diffusers.py Wan2.2-I2V-14B-720p").items()},
}
