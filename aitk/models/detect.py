"""Which arch a local model folder holds, read from its files (no torch, no weights).

Upstream reads a config with neither `arch` nor an `is_*` flag as SD 1.x; aitk first
looks at the folder the config names: a diffusers pipeline folder's `model_index.json`
names its pipeline class, a denoiser's `config.json` its model class. Used by
aitk.config.loading when a config does not say; an explicit `arch` always wins.
"""

from __future__ import annotations

import json
from pathlib import Path

# Pipeline class (model_index.json `_class_name`) -> arch. Wan pipelines name one class
# for 2.1 and 2.2: a second expert (transformer_2/) makes it 2.2 14B.
PIPELINES: dict[str, str] = {
    "FluxPipeline": "flux", "FluxKontextPipeline": "flux_kontext",
    "ChromaPipeline": "chroma", "Flux2KleinPipeline": "flux2_klein",
    "QwenImagePipeline": "qwen_image", "QwenImageEditPipeline": "qwen_image_edit",
    "QwenImageEditPlusPipeline": "qwen_image_edit_plus",
    "StableDiffusionXLPipeline": "sdxl", "StableDiffusionPipeline": "sd1",
    "WanPipeline": "wan21", "WanImageToVideoPipeline": "wan21_i2v",
    "PRXPixelPipeline": "prx_pixel",
}
SECOND_EXPERT = {"wan21": "wan22_14b", "wan21_i2v": "wan22_14b_i2v"}
# Denoiser class (transformer/ or unet/ config.json, or a denoiser folder's own) -> arch,
# for folders without a model_index.json (aitk's example models, a bare denoiser).
DENOISERS: dict[str, str] = {"ExampleTransformer": "example",
                             "FluxTransformer2DModel": "flux",
                             "ChromaTransformer2DModel": "chroma",
                             "QwenImageTransformer2DModel": "qwen_image",
                             "WanTransformer3DModel": "wan21"}
MAX_JSON_BYTES = 1 << 20


def _class_name(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_JSON_BYTES))
    except (OSError, ValueError):
        return None
    name = data.get("_class_name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def detect_arch(folder: Path) -> str | None:
    """The arch of the model in `folder`, or None when the files do not say."""
    if not folder.is_dir():
        return None
    pipeline = _class_name(folder / "model_index.json")
    if pipeline in PIPELINES:
        arch = PIPELINES[pipeline]
        if arch in SECOND_EXPERT and (folder / "transformer_2").is_dir():
            return SECOND_EXPERT[arch]
        return arch
    for config in (folder / "transformer" / "config.json", folder / "unet" / "config.json",
                   folder / "config.json"):
        found = DENOISERS.get(_class_name(config) or "")
        if found:
            return found
    return None
