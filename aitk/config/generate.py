"""`job: generate` (`to_folder`): prompts through the arch's preview pipeline, with LoRAs
at given weights, into a folder of images (aitk.jobs.generate).

    job: generate
    config:
      name: generate
      process:
        - type: to_folder
          output_folder: output/gen
          device: cuda:0
          generate:
            width: 1024
            height: 1024
            neg: "cartoon, fake"
            seed: -1                 # -1: a random seed per image (recorded in its name)
            guidance_scale: 7
            sample_steps: 20
            ext: .png                # .png, .jpg, .jpeg, .webp
            random_prompts: false    # true: max_images prompts of random picks
            max_random_per_prompt: 1 #   each joins 1..this many listed prompts
            max_images: 10000
            shuffle: false           # true: the prompts in a seeded random order
            prompt_file: false       # true: a .txt with the prompt beside each image
            prompts:                 # or the path of a text file, one prompt a line
              - "photo of batman"
              - "photo of a superhero --n batman --seed 7 --m 0.8"
          model: {name_or_path: /models/flux, arch: flux, dtype: bf16}
          loras:                     # aitk: LoRAs applied at these weights
            - {path: output/my_lora/my_lora.safetensors, weight: 1.0}

A prompt's flags (aitk.config.prompt_flags) override the defaults for that image; `--m`
scales every LoRA of the process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from aitk.config.mod import LoraRef
from aitk.config.prompt_flags import PromptFlagError, parse_prompt
from aitk.config.schema import JobBase, JobName, ModelConfig, PositiveInt, _Strict

EXTENSIONS = ("png", "jpg", "jpeg", "webp")


class GenerateSettings(_Strict):
    sampler: str = "ddpm"  # upstream's key; each arch samples with its own scheduler
    width: PositiveInt = 512
    height: PositiveInt = 512
    # [width, height] pairs; each image takes one, chosen by its seed.
    size_list: list[tuple[PositiveInt, PositiveInt]] | None = None
    neg: str = ""
    seed: int = -1
    guidance_scale: float = 7.0
    sample_steps: PositiveInt = 20
    prompts: list[str] | str  # a list, or the path of a text file (one prompt a line)
    ext: str = "png"
    prompt_file: bool = False
    num_repeats: PositiveInt = 1
    # Upstream's prompt list changes (aitk.jobs.generate.prompt_list): random_prompts
    # makes max_images prompts, each 1..max_random_per_prompt listed prompts drawn at
    # random and joined by ", "; shuffle shuffles the list once. Seeded by `seed`.
    random_prompts: bool = False
    max_random_per_prompt: PositiveInt = 1
    max_images: PositiveInt = 10000  # upstream reads it with random_prompts only
    shuffle: bool = False
    # Video archs: frames per clip and its playback rate (aitk; upstream's --frames).
    num_frames: PositiveInt = 1
    fps: PositiveInt = 16

    @field_validator("ext")
    @classmethod
    def _known_ext(cls, value: str) -> str:
        ext = value.lower().lstrip(".")
        if ext not in EXTENSIONS:
            raise ValueError(f"must be one of {', '.join('.' + e for e in EXTENSIONS)}")
        return ext

    @field_validator("prompts")
    @classmethod
    def _flags_parse(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list):
            if not value:
                raise ValueError("no prompts: list at least one, or name a text file")
            for i, prompt in enumerate(value):
                try:
                    parse_prompt(prompt)
                except PromptFlagError as exc:
                    raise ValueError(f"[{i}]: {exc}") from None
        return value


class GenerateModelConfig(ModelConfig):
    lora_path: str | None = None  # upstream's key: one LoRA at weight 1


class GenerateProcess(_Strict):
    type: Literal["to_folder"]
    output_folder: str
    device: str | None = None  # None: the job's `device`, else cuda when available
    generate: GenerateSettings
    model: GenerateModelConfig
    # The dtype the model runs in (upstream's key and default); float32 on a CPU,
    # where half precision is slow or missing.
    dtype: Literal["float16", "fp16", "bfloat16", "bf16", "float32", "fp32"] = "float16"
    loras: list[LoraRef] = []

    @property
    def all_loras(self) -> list[LoraRef]:
        extra = [LoraRef(path=self.model.lora_path)] if self.model.lora_path else []
        return [*extra, *self.loras]


class GenerateSection(_Strict):
    name: JobName
    process: Annotated[list[GenerateProcess], Field(min_length=1)]


class GenerateJob(JobBase):
    job: Literal["generate"]
    config: GenerateSection

    def output_dir(self) -> Path:
        return Path(self.config.process[0].output_folder).expanduser()


SECTIONS: dict[Any, str] = {GenerateJob: "job", GenerateSection: "generate",
                            GenerateProcess: "generate.process",
                            GenerateSettings: "generate.generate",
                            GenerateModelConfig: "model", LoraRef: "merge.loras"}
