"""`job: generate`: prompts through the arch's preview pipeline (BaseModel.generate_images)
with LoRAs at given weights (aitk.adapters.hooks), into a folder of images.

Each image is one (prompt, seed): the prompt's flags (aitk.config.prompt_flags) over the
`generate:` defaults. Seed -1 draws a random seed for the image, which its name and
metadata record, so any image can be made again; repeats (`num_repeats`) take seed + r.
`random_prompts` / `max_random_per_prompt` / `max_images` / `shuffle` change the prompt
list first (prompt_list, seeded by `seed`).
Images are named `NNNN_<prompt words>_<seed>.<ext>` and carry the settings that made
them: PNG text (`parameters`, as other tools show them, and `aitk` as JSON) and, for
every format, EXIF ImageDescription (the JSON) and Software (aitk's mark: a file at one
of these names that aitk did not write is never overwritten). A video arch's clip is an
animated WebP.
"""

from __future__ import annotations

import io
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from PIL import Image

from aitk.config.generate import GenerateProcess, GenerateSettings
from aitk.config.loading import LoadedConfig
from aitk.config.prompt_flags import parse_prompt
from aitk.config.schema import ModelConfig
from aitk.errors import PromptFlagError
from aitk.models.base import GenerateImageConfig
from aitk.run import distributed
from aitk.run.ownership import image_is_ours, image_mark
from aitk.run.signals import StopFlag
from aitk.run.status import StatusFile
from aitk.run.train import Outcome
from aitk_common.files import atomic_write_bytes, atomic_write_text

EXIF_DESCRIPTION = 0x010E  # ImageDescription
RUN_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
              "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}
PIL_FORMATS = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "webp": "WEBP"}


@dataclass(frozen=True)
class Planned:
    """One image to make."""

    config: GenerateImageConfig
    multiplier: float  # the LoRAs' weights are multiplied by this (`--m`)
    path: Path


def slug(prompt: str, limit: int = 48) -> str:
    """The prompt's words as a file-name part: lowercase letters and digits, `-`."""
    words = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")
    return words[:limit].rstrip("-") or "empty"


def prompt_list(prompts: list[str], g: GenerateSettings) -> list[str]:
    """The prompts the job makes, before its repeats (upstream's GenerateConfig):
    `random_prompts`: `max_images` prompts, each 1 to `max_random_per_prompt` of the
    listed prompts drawn with replacement and joined by ", "; then `shuffle`: the list
    in a random order. Draws come from `seed` (-1: fresh ones, as upstream), so a job
    with a seed makes the same list every time."""
    if not (g.random_prompts or g.shuffle):
        return list(prompts)
    rng = np.random.default_rng([g.seed, 23] if g.seed >= 0 else secrets.randbits(64))
    out = list(prompts)
    if g.random_prompts:
        flagged = [p for p in prompts if parse_prompt(p).prompt != p.strip()]
        if flagged:
            raise PromptFlagError(f"random_prompts joins several prompts into one, so "
                                  f"their flags would clash; {flagged[0]!r} has flags: put "
                                  "its settings in the generate section")
        out = []
        for _ in range(g.max_images):
            count = int(rng.integers(1, g.max_random_per_prompt + 1))
            out.append(", ".join(prompts[int(i)] for i in rng.integers(0, len(prompts),
                                                                       count)))
    if g.shuffle:
        out = [out[int(i)] for i in rng.permutation(len(out))]
    return out


def plan(prompts: list[str], proc: GenerateProcess, folder: Path) -> list[Planned]:
    """Every image of the process, in order, each with its final seed and file name."""
    g = proc.generate
    out = []
    for r in range(g.num_repeats):
        for prompt_text in prompts:
            parsed = parse_prompt(prompt_text)
            v = parsed.values
            seed = int(v.get("seed", g.seed))
            seed = secrets.randbelow(2**32) if seed == -1 else seed + r
            width, height = g.width, g.height
            if g.size_list:
                width, height = g.size_list[seed % len(g.size_list)]
            config = GenerateImageConfig(
                prompt=parsed.prompt, width=v.get("width", width),
                height=v.get("height", height), seed=seed,
                guidance_scale=v.get("guidance_scale", g.guidance_scale),
                sample_steps=v.get("sample_steps", g.sample_steps),
                negative_prompt=v.get("negative_prompt", g.neg),
                num_frames=v.get("num_frames", g.num_frames), fps=v.get("fps", g.fps))
            index = len(out)
            ext = "webp" if config.num_frames > 1 else g.ext
            path = folder / f"{index:04d}_{slug(parsed.prompt)}_{seed}.{ext}"
            out.append(Planned(config, float(v.get("network_multiplier", 1.0)), path))
    return out


def load_for_inference(model_cfg: ModelConfig, device: str | torch.device | None,
                       dtype: torch.dtype, stream: TextIO) -> Any:
    """The arch's model, loaded for sampling on `device` (None: cuda when available)."""
    from aitk.models import registry
    from aitk.run.assembly import ensure_example_model, pick_device, quiet_library_progress

    target = device if isinstance(device, torch.device) else pick_device(device)
    quiet_library_progress()
    ensure_example_model(model_cfg)
    model = registry.get_model_class(model_cfg.arch)(model_cfg, device=target, dtype=dtype)
    print(f"loading {model_cfg.arch} model {model_cfg.name_or_path} on {target.type}",
          file=stream, flush=True)
    model.load_model()
    return model


def settings(item: Planned, model_cfg: ModelConfig, loras: list[dict[str, Any]]
             ) -> dict[str, Any]:
    """What made the image (its metadata)."""
    import aitk

    c = item.config
    return {"prompt": c.prompt, "negative_prompt": c.negative_prompt, "seed": c.seed,
            "width": c.width, "height": c.height, "steps": c.sample_steps,
            "guidance_scale": c.guidance_scale, "num_frames": c.num_frames, "fps": c.fps,
            "model": model_cfg.name_or_path, "arch": model_cfg.arch,
            "loras": [{**lr, "weight": lr["weight"] * item.multiplier} for lr in loras],
            "software": f"{aitk.SOFTWARE_NAME} {aitk.__version__}"}


def parameters_text(s: dict[str, Any]) -> str:
    """The `parameters` text other image tools show (prompt, negative, settings)."""
    line = (f"Steps: {s['steps']}, CFG scale: {s['guidance_scale']}, Seed: {s['seed']}, "
            f"Size: {s['width']}x{s['height']}, Model: {s['model']}")
    return f"{s['prompt']}\nNegative prompt: {s['negative_prompt']}\n{line}"


def image_file(image: Image.Image | list[Image.Image], fmt: str, fps: int,
               meta: dict[str, Any]) -> bytes:
    from PIL.PngImagePlugin import PngInfo

    exif = image_mark()
    exif[EXIF_DESCRIPTION] = json.dumps(meta, sort_keys=True)
    buf = io.BytesIO()
    if isinstance(image, list):  # a video arch's frames: an animated WebP
        first, *rest = [f.convert("RGB") for f in image]
        first.save(buf, format="WEBP", save_all=True, append_images=rest,
                   duration=max(1, round(1000 / fps)), loop=0, exif=exif)
        return buf.getvalue()
    extra: dict[str, Any] = {}
    if fmt == "png":
        info = PngInfo()
        info.add_text("parameters", parameters_text(meta))
        info.add_text("aitk", json.dumps(meta, sort_keys=True))
        extra["pnginfo"] = info
    image.convert("RGB").save(buf, format=PIL_FORMATS[fmt], exif=exif, **extra)
    return buf.getvalue()


def read_prompts(proc: GenerateProcess) -> list[str]:
    from aitk.audit.file_jobs import prompt_lines

    prompts = proc.generate.prompts
    return prompt_lines(Path(prompts).expanduser()) if isinstance(prompts, str) \
        else list(prompts)


def run_process(loaded: LoadedConfig, proc: GenerateProcess, stop: StopFlag,
                stream: TextIO, world: distributed.World, status: StatusFile) -> Outcome:
    from aitk.adapters.hooks import LoraHooks
    from aitk.run.assembly import pick_device

    folder = Path(proc.output_folder).expanduser()
    device = pick_device(proc.device)
    # Half precision is slow or missing on CPUs: they run float32.
    dtype = torch.float32 if device.type == "cpu" else RUN_DTYPES[proc.dtype]
    items = plan(prompt_list(read_prompts(proc), proc.generate), proc, folder)
    status.phase("loading")
    model = load_for_inference(proc.model, device, dtype, stream)
    loras = [{"path": r.path, "weight": r.weight} for r in proc.all_loras]
    written = 0
    with LoraHooks(model, [(Path(r["path"]).expanduser(), r["weight"]) for r in loras]
                   ) as hooks:
        for i, item in enumerate(items):
            stop.check()
            status.phase("working", step=i, total_steps=len(items),
                         message=f"generating {item.path.name}")
            if item.path.exists() and not image_is_ours(item.path):
                print(f"{item.path} was not written by aitk; left as it is", file=stream)
                continue
            hooks.set_multiplier(item.multiplier)
            image = model.generate_images([item.config])[0]
            meta = settings(item, proc.model, loras)
            fmt = item.path.suffix.lstrip(".")
            atomic_write_bytes(item.path, image_file(image, fmt, item.config.fps, meta))
            if proc.generate.prompt_file:
                atomic_write_text(item.path.with_suffix(".txt"), item.config.prompt + "\n")
            written += 1
            print(f"[{i + 1}/{len(items)}] {item.path.name}", file=stream, flush=True)
    status.phase("working", step=len(items), total_steps=len(items))
    print(f"wrote {written} images to {folder}", file=stream, flush=True)
    return Outcome.FINISHED
