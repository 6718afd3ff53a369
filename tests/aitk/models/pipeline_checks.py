"""What the per-arch model tests share when they hold the trainer's previews against
diffusers' pipelines (beside arch_checks.py, which has the job, resume, memory and
file checks): the interop render's settings, the trainer's preview with a LoRA file on
(or a random LoRA file to put on), the stock pipeline in float32, the arch's own or the
pipeline's call as a render for `arch_checks.assert_loaded_lora_reproduces`, images and
clips as arrays or 8-bit levels, the check that `load_lora_weights` turns a pipeline's
render into the trainer's preview, and the bf16 preview through the float32 VAE.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from aitk.adapters import AdapterNetwork
from aitk.models.base import BaseModel, GenerateImageConfig
from tests.aitk.models.arch_checks import image_array, model_cfg, randomise
from tests.aitk.models.conftest import NetCfg


def float32_pipeline(pipeline_cls: Any, model_dir: Path, **parts: Any) -> Any:
    """diffusers' `pipeline_cls` from the folder `model_dir` in float32 (`parts` replacing
    some of its parts), its progress bar off."""
    pipe = pipeline_cls.from_pretrained(model_dir, torch_dtype=torch.float32, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def interop_preview(**overrides: Any) -> GenerateImageConfig:
    """The interop checks' render: "a red circle", 32x32, 3 steps, seed 5, guidance 2."""
    return GenerateImageConfig(**{**dict(prompt="a red circle", width=32, height=32,
                                         sample_steps=3, seed=5, guidance_scale=2.0),
                                  **overrides})


def frames_array(frames: list[Any]) -> np.ndarray:
    """A clip's PIL frames as floats in [0, 1], stacked, to compare pixel by pixel."""
    return np.stack([np.asarray(f, dtype=np.float32) / 255.0 for f in frames])


def random_lora_file(model: BaseModel, path: Path) -> Path:
    """A rank-4, alpha-8 LoRA on `model` with random weights (seed 4, scale 0.3), saved
    to `path`: a file whose effect on a render is plain to measure."""
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    randomise(network, seed=4, scale=0.3)
    network.save_file(path)
    return path


def trainer_preview(model: BaseModel, lora: Path, gen: GenerateImageConfig,
                    cached_text: bool = False,
                    as_array: Callable[[Any], np.ndarray] = image_array,
                    ) -> tuple[np.ndarray, Any]:
    """The trainer's render of `gen` with the LoRA file `lora` (rank 4, alpha 8) on
    `model` (`as_array`: `frames_array` for a clip), and the prompt embeds it used
    (`gen`'s prompt and ""); with `cached_text` the text encoder is unloaded first, as
    with cached text embeddings."""
    AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0)).load_file(lora)
    embeds = model.encode_prompts([gen.prompt, ""])
    if cached_text:
        model.unload_text_encoder()
    return as_array(model.generate_images([gen], embeds)[0]), embeds


def arch_pipeline_render(run_pipeline: Callable[..., Any], pipe: Any,
                         gen: GenerateImageConfig, *embeds: Any,
                         extra: tuple[Any, ...] = (),
                         as_array: Callable[[Any], np.ndarray] = image_array,
                         **options: Any) -> Callable[[], np.ndarray]:
    """For `assert_loaded_lora_reproduces`: the arch's own `run_pipeline(pipe, gen,
    *embeds, <gen's seeded generator>, cpu, float32, *extra, **options)`, as an image
    array (`as_array`: `frames_array` for a clip)."""

    def render() -> np.ndarray:
        return as_array(run_pipeline(pipe, gen, *embeds,
                                     torch.Generator().manual_seed(gen.seed),
                                     torch.device("cpu"), torch.float32, *extra,
                                     **options))

    return render


def pipeline_render(pipe: Any, gen: GenerateImageConfig,
                    **embeds: Any) -> Callable[[], np.ndarray]:
    """For `assert_loaded_lora_reproduces`: diffusers' `pipe` called on the prompt states
    `embeds` at `gen`'s size, steps, guidance and seed, as an image array."""

    def render() -> np.ndarray:
        out = pipe(**embeds, width=gen.width, height=gen.height,
                   num_inference_steps=gen.sample_steps, guidance_scale=gen.guidance_scale,
                   generator=torch.Generator().manual_seed(gen.seed))
        return image_array(out.images[0])

    return render


def assert_bf16_previews_through_the_float32_vae(cls: type[BaseModel], model_dir: Path,
                                                 width: int = 32, height: int = 32,
                                                 **gen: Any) -> None:
    """`cls` loaded in bfloat16 keeps its VAE in float32, and a `width` x `height`
    preview through it (`gen`: more of its settings) comes out at that size."""
    model = cls(model_cfg(cls.arch, model_dir), dtype=torch.bfloat16)
    model.load_model()
    assert model.vae.dtype == torch.float32 and model.model.dtype == torch.bfloat16
    [image] = model.generate_images([GenerateImageConfig("a red circle", width=width,
                                                         height=height, sample_steps=2,
                                                         **gen)])
    assert image.size == (width, height)


def png_levels(path: Path) -> np.ndarray:
    """A PNG's 0..255 levels, signed, to subtract."""
    return np.asarray(Image.open(path), dtype=np.int16)


def image_levels(image: Any) -> np.ndarray:
    """A PIL image's 0..255 levels, signed, to subtract."""
    return np.asarray(image, dtype=np.int16)


def rounded_levels(image: np.ndarray) -> np.ndarray:
    """A pipeline's `output_type="np"` image as 0..255 levels, signed, to subtract."""
    return np.round(image * 255).astype(np.int16)




def assert_lora_turns_the_render_into_the_preview(pipe: Any, lora: Path,
                                                  preview: np.ndarray,
                                                  render: Callable[[], np.ndarray],
                                                  changed_by: int = 2) -> None:
    """diffusers' `pipe`, after `load_lora_weights(lora)`, renders (`render()`, levels)
    the trainer's `preview` to one level; before it, more than `changed_by` levels off."""
    plain = render()
    pipe.load_lora_weights(str(lora))
    assert np.abs(render() - preview).max() <= 1  # tolerance: one 8-bit level
    assert np.abs(plain - preview).max() > changed_by  # the LoRA changes the image
