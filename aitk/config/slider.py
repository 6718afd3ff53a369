"""`job: train` with a `slider` process: upstream's original slider, a LoRA trained from
prompt pairs alone (no images needed).

    job: train
    config:
      name: detail_slider_v1
      training_folder: output/LoRA       # upstream puts these two at the job level;
      device: cuda:0                     # they are the processes' defaults
      process:
        - type: slider
          network: {type: lierla, linear: 8, linear_alpha: 4}
          train: {steps: 500, lr: 2e-4, max_denoising_steps: 40, ...}
          model / save / sample: as for LoRA training
          slider:
            resolutions: [[512, 512]]
            targets:
              - {target_class: "", positive: "high detail", negative: "blurry",
                 weight: 1.0, shuffle: true}
            anchors: [{prompt: "a woman", neg_prompt: "animal", multiplier: 1.0}]

What the loss does is in aitk.run.slider. Upstream's other `job: train` processes (VAE,
ESRGAN, ...) stay refused (aitk.config.kinds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from aitk.config.schema import (
    JobBase,
    JobName,
    NetworkConfig,
    PositiveInt,
    TrainConfig,
    TrainingProcess,
    _Strict,
)


class SliderTarget(_Strict):
    """One concept: the LoRA at +`multiplier` moves `target_class` towards `positive`
    and away from `negative`, at -`multiplier` the other way."""

    target_class: str = ""
    positive: str = ""
    negative: str = ""
    multiplier: float = 1.0
    weight: float = 1.0  # this target's share of the loss
    # Each step takes the comma-separated parts of both prompts in a seeded order.
    shuffle: bool = False

    @model_validator(mode="after")
    def _has_a_direction(self) -> SliderTarget:
        if not (self.positive.strip() or self.negative.strip()):
            raise ValueError("set positive or negative (the two ends of the slider)")
        return self


class SliderAnchor(_Strict):
    """A prompt whose prediction the LoRA must leave as it is, at +-`multiplier`."""

    prompt: str = ""
    neg_prompt: str = ""  # upstream's key; the anchor's prediction does not use it
    multiplier: float = 1.0


Resolution = tuple[PositiveInt, PositiveInt]


class SliderSettings(_Strict):
    targets: Annotated[list[SliderTarget], Field(min_length=1)]
    anchors: list[SliderAnchor] = []
    # [width, height] pairs the training latents are drawn at, one per step (seeded).
    resolutions: Annotated[list[Resolution], Field(min_length=1)] = [(512, 512)]
    # Upstream batches the slider's passes; a speed setting only.
    batch_full_slide: bool = True


class SliderTrainConfig(TrainConfig):
    # The partial denoising that makes each step's latents runs this many steps in all
    # and stops after a seeded number of them (upstream's key; its default for sliders).
    max_denoising_steps: Annotated[int, Field(ge=2)] = 40  # type: ignore[assignment]

    @property
    def denoising_steps(self) -> tuple[int, int]:
        """Here max_denoising_steps counts the partial denoising's steps (as upstream's
        slider), so it leaves the training timesteps whole."""
        return 0, 999


class SliderProcess(TrainingProcess):
    type: Literal["slider"]
    network: NetworkConfig  # a slider is a LoRA: required
    train: SliderTrainConfig = SliderTrainConfig()
    # `datasets` optional: with them the latents are the images' (noised as in
    # training); without, each step denoises from pure noise (upstream's two modes).
    slider: SliderSettings


class SliderSection(_Strict):
    name: JobName
    process: Annotated[list[SliderProcess], Field(min_length=1)]
    log_dir: str | None = None  # every process's TensorBoard folder (upstream's)


class SliderJob(JobBase):
    job: Literal["train"]
    config: SliderSection

    def output_dir(self) -> Path:
        return Path(self.config.process[0].training_folder).expanduser() / self.name

    def status_dir(self) -> Path | None:
        return self.output_dir()


SECTIONS = {SliderJob: "job", SliderSection: "config", SliderProcess: "process",
            SliderTrainConfig: "train", SliderSettings: "slider", SliderTarget: "slider.targets",
            SliderAnchor: "slider.anchors"}
