"""Preview images during training: fixed prompts and seeds, so previews compare across
steps. Saved atomically as `training_folder/NAME/samples/<step:09d>_<i>.<format>`, each
marked as aitk's (EXIF `Software`); a file at that name without the mark (someone else's,
or a link) is never overwritten."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

import aitk
from aitk.config import SampleConfig
from aitk.data.dataset import TRIGGER_TAG
from aitk.files import atomic_write_bytes
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.prompt_embeds import AdvancedPromptEmbeds


def sample_prompt(prompt: str, trigger: str | None) -> str:
    """`[trigger]` becomes the trigger word; unlike captions it is not prepended."""
    return prompt.replace(TRIGGER_TAG, trigger or "").strip()


def image_configs(cfg: SampleConfig, trigger: str | None) -> list[GenerateImageConfig]:
    neg_default = cfg.neg or ""
    out = []
    for i, item in enumerate(cfg.items):
        seed = cfg.seed + i if cfg.walk_seed else cfg.seed
        out.append(GenerateImageConfig(
            prompt=sample_prompt(item.prompt, trigger),
            width=item.width or cfg.width, height=item.height or cfg.height,
            seed=item.seed if item.seed is not None else seed,
            guidance_scale=(item.guidance_scale if item.guidance_scale is not None
                            else cfg.guidance_scale),
            sample_steps=item.sample_steps or cfg.sample_steps,
            negative_prompt=sample_prompt(item.neg if item.neg is not None else neg_default,
                                          trigger)))
    return out


def sample_path(folder: Path, step: int, index: int, fmt: str) -> Path:
    return folder / f"{step:09d}_{index}.{fmt}"


EXIF_SOFTWARE = 0x0131  # the EXIF tag PNG, JPEG and WebP all carry


def written_by_aitk(path: Path) -> bool:
    """A regular file (not a link) whose EXIF `Software` names aitk."""
    from PIL import Image

    if path.is_symlink() or not path.is_file():
        return False
    try:
        with Image.open(path) as image:
            return image.getexif().get(EXIF_SOFTWARE) == aitk.SOFTWARE_NAME
    except Exception:  # not an image, unreadable: not ours either way
        return False


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_samples(model: BaseModel, configs: list[GenerateImageConfig], folder: Path,
                  step: int, fmt: str,
                  prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None,
                  say: Callable[[str], None] | None = None) -> list[Path]:
    """The paths written; a path held by a file aitk did not write is skipped (said)."""
    from PIL import Image

    # fork_rng: previews must not move the global generators the training steps use,
    # or a run that sampled would train differently from one that did not.
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        images = model.generate_images(configs, prompt_embeds=prompt_embeds)
    paths = []
    pil_format = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[fmt]
    mark = Image.Exif()
    mark[EXIF_SOFTWARE] = aitk.SOFTWARE_NAME
    for i, image in enumerate(images):
        path = sample_path(folder, step, i, fmt)
        if os.path.lexists(path) and not written_by_aitk(path):
            (say or _stderr)(f"{path} was not written by aitk; left as it is (no preview "
                             "written there)")
            continue
        buf = io.BytesIO()
        image.save(buf, format=pil_format, exif=mark)
        atomic_write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths
