"""Preview images during training: fixed prompts and seeds, so previews compare across
steps. Saved atomically as `training_folder/NAME/samples/<step:09d>_<i>.<format>`, each
marked as aitk's (EXIF `Software`); a file at that name without the mark (someone else's,
or a link) is never overwritten.

A video arch's preview (a list of frames) is saved as an animated WebP
`<step:09d>_<i>.webp` (Pillow; each frame shown 1/fps s, looping) plus a frame strip
`<step:09d>_<i>.<format>`: up to STRIP_FRAMES evenly spaced frames side by side (with
`format: webp` the strip is `<step:09d>_<i>_strip.webp`, the animation keeping the name).
A preview with a soundtrack (aitk.models.base.VideoWithSound: LTX-2) is written as
`<step:09d>_<i>.mp4` too: H.264 frames at the sample's fps with the sound as AAC, encoded
with PyAV (FFmpeg's libraries, as aitk.data.video decodes), marked as aitk's in the
container's `comment` tag.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

import aitk
from aitk.config.schema import SampleConfig
from aitk.data.dataset import TRIGGER_TAG
from aitk.data.video import spread
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.run.ownership import MP4_TAG, image_mark, preview_is_ours
from aitk.run.status import StatusFile
from aitk_common.files import atomic_write_bytes


def sample_prompt(prompt: str, trigger: str | None) -> str:
    """`[trigger]` becomes the trigger word; unlike captions it is not prepended."""
    return prompt.replace(TRIGGER_TAG, trigger or "").strip()


def image_configs(cfg: SampleConfig, trigger: str | None) -> list[GenerateImageConfig]:
    """One config per preview: the item's keys over the section's; a prompt's flags
    (`--n`, `--seed`, `--m`, ...: aitk.config.prompt_flags) over both."""
    from aitk.config.prompt_flags import parse_prompt

    neg_default = cfg.neg or ""
    out = []
    for i, item in enumerate(cfg.items):
        seed = cfg.seed + i if cfg.walk_seed else cfg.seed
        parsed = parse_prompt(item.prompt)
        flags = parsed.values
        neg = flags.get("negative_prompt", item.neg if item.neg is not None else neg_default)
        multiplier = item.network_multiplier if item.network_multiplier is not None else \
            cfg.network_multiplier
        out.append(GenerateImageConfig(
            prompt=sample_prompt(parsed.prompt, trigger),
            width=flags.get("width", item.width or cfg.width),
            height=flags.get("height", item.height or cfg.height),
            seed=flags.get("seed", item.seed if item.seed is not None else seed),
            guidance_scale=flags.get("guidance_scale", item.guidance_scale
                                     if item.guidance_scale is not None
                                     else cfg.guidance_scale),
            sample_steps=flags.get("sample_steps", item.sample_steps or cfg.sample_steps),
            num_frames=flags.get("num_frames", item.num_frames or cfg.num_frames),
            fps=flags.get("fps", item.fps or cfg.fps),
            negative_prompt=sample_prompt(neg, trigger),
            ctrl_img=(item.ctrl_imgs or [None])[0], ctrl_imgs=item.ctrl_imgs,
            network_multiplier=flags.get("network_multiplier", multiplier)))
    return out


def sample_path(folder: Path, step: int, index: int, fmt: str) -> Path:
    return folder / f"{step:09d}_{index}.{fmt}"


PIL_FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
STRIP_FRAMES = 5


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def image_bytes(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=PIL_FORMATS[fmt], exif=image_mark())
    return buf.getvalue()


def animated_webp(frames: Sequence[Image.Image], fps: float) -> bytes:
    """The frames as a looping animated WebP, each shown 1/fps s (at least 1 ms)."""
    first, *rest = [f.convert("RGB") for f in frames]
    buf = io.BytesIO()
    first.save(buf, format="WEBP", save_all=True, append_images=rest,
               duration=max(1, round(1000 / fps)), loop=0, exif=image_mark())
    return buf.getvalue()


def video_with_sound(frames: Sequence[Image.Image], fps: float, audio: Any,
                     sample_rate: int) -> bytes:
    """The frames (H.264, yuv420p, at `fps`) and `audio` ((channels, samples) float in
    [-1, 1], AAC at `sample_rate`) as one mp4."""
    import av
    import numpy as np

    pcm = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1, np.shape(audio)[-1]),
                  -1.0, 1.0)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        out.metadata[MP4_TAG] = aitk.SOFTWARE_NAME
        from fractions import Fraction

        video = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        first = frames[0]
        # yuv420p wants even sides; a 32 px size multiple always gives them
        video.width, video.height = first.width // 2 * 2, first.height // 2 * 2
        video.pix_fmt = "yuv420p"
        sound = out.add_stream("aac", rate=int(sample_rate),
                               layout="mono" if pcm.shape[0] == 1 else "stereo")
        for image in frames:
            frame = av.VideoFrame.from_image(image.convert("RGB").crop(
                (0, 0, video.width, video.height)))
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        planar = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm[:2]), format="fltp",
                                            layout="mono" if pcm.shape[0] == 1 else "stereo")
        planar.sample_rate = int(sample_rate)
        out.mux(sound.encode(planar))
        out.mux(sound.encode(None))
    return buf.getvalue()


def frame_strip(frames: Sequence[Image.Image], count: int = STRIP_FRAMES) -> Image.Image:
    """Up to `count` evenly spaced frames (first and last included) side by side."""
    picked = [frames[i] for i in spread(len(frames), min(count, len(frames)))]
    width, height = picked[0].size
    strip = Image.new("RGB", (width * len(picked), height))
    for n, frame in enumerate(picked):
        strip.paste(frame.convert("RGB").resize((width, height)), (n * width, 0))
    return strip


def generate_at_multipliers(model: BaseModel, configs: list[GenerateImageConfig],
                            prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None,
                            set_multiplier: Callable[[float], None] | None) -> list[Any]:
    """The previews, each with the adapter at its config's `network_multiplier` (runs of
    equal multipliers in one call); the multiplier is 1 again afterwards."""
    if set_multiplier is None or all(c.network_multiplier == 1.0 for c in configs):
        return model.generate_images(configs, prompt_embeds=prompt_embeds)
    images: list[Any] = []
    try:
        start = 0
        while start < len(configs):
            end = start
            while end < len(configs) and \
                    configs[end].network_multiplier == configs[start].network_multiplier:
                end += 1
            set_multiplier(configs[start].network_multiplier)
            images += model.generate_images(configs[start:end], prompt_embeds=prompt_embeds)
            start = end
    finally:
        set_multiplier(1.0)
    return images


def write_samples(model: BaseModel, configs: list[GenerateImageConfig], folder: Path,
                  step: int, fmt: str,
                  prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None = None,
                  say: Callable[[str], None] | None = None,
                  set_multiplier: Callable[[float], None] | None = None) -> list[Path]:
    """Every file written: one image per config, or a video's animation and strip. A path
    held by a file aitk did not write is skipped (said). `set_multiplier` sets the
    adapter's weight (each config's `network_multiplier`; sliders preview both ways)."""
    # fork_rng: previews must not move the global generators the training steps use,
    # or a run that sampled would train differently from one that did not.
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        images = generate_at_multipliers(model, configs, prompt_embeds, set_multiplier)
    paths = []
    for i, (image, cfg) in enumerate(zip(images, configs, strict=True)):
        if isinstance(image, Image.Image):
            files = {sample_path(folder, step, i, fmt): image}
        else:
            if not image:
                raise ValueError(f"the model returned no frames for sample {i}")
            animation = sample_path(folder, step, i, "webp")
            strip = sample_path(folder, step, i, fmt)
            if strip == animation:
                strip = animation.with_name(f"{animation.stem}_strip.webp")
            files = {animation: image, strip: frame_strip(image)}
            if getattr(image, "audio", None) is not None:
                files[sample_path(folder, step, i, "mp4")] = image
        for path, content in files.items():
            if os.path.lexists(path) and not preview_is_ours(path):
                (say or _stderr)(f"{path} was not written by aitk; left as it is (no "
                                 "preview written there)")
                continue
            if isinstance(content, Image.Image):
                data = image_bytes(content, fmt)
            elif path.suffix == ".mp4":
                data = video_with_sound(content, cfg.fps, content.audio, content.sample_rate)
            else:
                data = animated_webp(content, cfg.fps)
            atomic_write_bytes(path, data)
            paths.append(path)
    return paths


class Previews:
    """The loop's `sample(step)` on rank 0: one step's previews, with the status file
    in its `sampling` phase meanwhile."""

    def __init__(self, model: BaseModel, configs: list[GenerateImageConfig], folder: Path,
                 fmt: str, prompt_embeds: Mapping[str, AdvancedPromptEmbeds] | None,
                 status: StatusFile, say: Callable[[str], None],
                 set_multiplier: Callable[[float], None] | None = None) -> None:
        self.model, self.configs, self.folder, self.fmt = model, configs, folder, fmt
        self.prompt_embeds, self.status, self.say = prompt_embeds, status, say
        self.set_multiplier = set_multiplier

    def __call__(self, step: int) -> None:
        self.status.phase("sampling")
        paths = write_samples(self.model, self.configs, self.folder, step, self.fmt,
                              self.prompt_embeds, say=self.say,
                              set_multiplier=self.set_multiplier)
        self.say(f"wrote {len(paths)} samples for step {step}")
        self.status.phase("training")
