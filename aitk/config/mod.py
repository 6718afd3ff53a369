"""`job: mod` (`rescale_lora`) and `job: merge`: arithmetic on LoRA files
(aitk.jobs.merge), with no model loaded unless a LoRA is merged into one.

    job: mod
    config:
      name: my_lora_v1
      process:
        - type: rescale_lora
          input_path: /loras/my_lora.safetensors
          output_path: /loras/my_lora_v1.safetensors     # may be input_path
          current_weight: 6.0      # the weight the LoRA is used at today ...
          target_weight: 1.0       # ... and the weight that should do the same
          scale_target: up_down    # or alpha
          save_dtype: fp16
          replace_meta: false      # true: the metadata is the job's `meta`

    job: merge                     # aitk's own (upstream's merge job has no processes)
    config:
      name: merged
      process:
        - type: merge_loras        # several LoRAs of one layout -> one LoRA
          loras: [{path: a.safetensors, weight: 1.0}, {path: b.safetensors, weight: 0.5}]
          output_path: output/merged.safetensors
          rank: null               # null: exact (ranks side by side); N: SVD to rank N
        - type: merge_into_model   # LoRAs baked into the model's weights
          loras: [{path: a.safetensors, weight: 1.0}]
          model: {name_or_path: /models/base, arch: flux}
          output_path: output/merged_model          # a diffusers folder, or a .safetensors
          save_format: diffusers
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, model_validator

from aitk.config.schema import (
    JobBase,
    JobName,
    ModelConfig,
    PositiveInt,
    SaveDtype,
    _Strict,
    by_type,
)


class RescaleProcess(_Strict):
    type: Literal["rescale_lora"]
    input_path: str
    output_path: str
    replace_meta: bool = False
    scale_target: Literal["up_down", "alpha"] = "up_down"
    save_dtype: SaveDtype = "fp16"
    current_weight: float
    target_weight: float

    @model_validator(mode="after")
    def _nonzero(self) -> RescaleProcess:
        for key in ("current_weight", "target_weight"):
            if getattr(self, key) == 0:
                raise ValueError(f"{key}: must not be 0 (the scale is "
                                 "current_weight / target_weight)")
        return self

    @property
    def scale(self) -> float:
        return self.current_weight / self.target_weight


class ModSection(_Strict):
    name: JobName
    process: Annotated[list[RescaleProcess], Field(min_length=1)]


class ModJob(JobBase):
    job: Literal["mod"]
    config: ModSection

    def output_dir(self) -> Path:
        return Path(self.config.process[0].output_path).expanduser().parent

    def targets(self) -> list[Path]:
        return [Path(p.output_path).expanduser() for p in self.config.process]


class LoraRef(_Strict):
    path: str
    # `strength` is what upstream's web UI merge script calls it.
    weight: float = Field(1.0, validation_alias=AliasChoices("weight", "strength"))


class MergeLorasProcess(_Strict):
    type: Literal["merge_loras"]
    loras: Annotated[list[LoraRef], Field(min_length=1)]
    output_path: str
    save_dtype: SaveDtype = "fp16"
    # None: the exact merge (the inputs' ranks side by side: the delta is the weighted
    # sum, no error); a number: each layer SVD-truncated to it (the error is reported).
    rank: PositiveInt | None = None


class MergeIntoModelProcess(_Strict):
    type: Literal["merge_into_model"]
    loras: Annotated[list[LoraRef], Field(min_length=1)]
    model: ModelConfig
    output_path: str  # a folder (save_format diffusers) or a .safetensors file
    save_format: Literal["diffusers", "safetensors"] = "diffusers"
    save_dtype: SaveDtype = "bf16"
    device: str | None = None  # None: the job's

    @model_validator(mode="after")
    def _unquantized(self) -> MergeIntoModelProcess:
        if self.model.quantize:
            raise ValueError("model.quantize: a merged model is saved in full precision; "
                             "set quantize: false")
        return self


MergeProcess = by_type(MergeLorasProcess, MergeIntoModelProcess)


class MergeSection(_Strict):
    name: JobName
    device: str = "cpu"
    process: Annotated[list[MergeProcess], Field(min_length=1)]


class MergeJob(JobBase):
    job: Literal["merge"]
    config: MergeSection

    def output_dir(self) -> Path:
        return Path(self.config.process[0].output_path).expanduser().parent

    def targets(self) -> list[Path]:
        return [Path(p.output_path).expanduser() for p in self.config.process]


SECTIONS: dict[Any, str] = {
    ModJob: "job", ModSection: "mod", RescaleProcess: "mod.process",
    MergeJob: "job", MergeSection: "merge", MergeLorasProcess: "merge.process",
    MergeIntoModelProcess: "merge.process", LoraRef: "merge.loras", ModelConfig: "model"}
