"""The job kinds aitk runs, by their `job:` value, each with its schema; aitk.jobs has
the runner of each. Torch-free: `run.py --check` and the web UI's server read it.

    job: extension   LoRA/LoKr training, full fine-tunes (no `network`), concept sliders
                     (aitk.config.schema; aitk.run)
    job: train       upstream's slider process (aitk.config.slider; aitk.run.slider)
    job: extract     a LoRA/LoCon from two models' difference (aitk.config.extract)
    job: mod         rescale a LoRA's strength into its weights (aitk.config.mod)
    job: merge       LoRAs into one LoRA, or into a model's weights (aitk.config.mod)
    job: generate    prompts to a folder of images (aitk.config.generate)

Anything else upstream runs is refused with one line (`refusal`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from aitk.config import extract, generate, mod, slider
from aitk.config.schema import SECTION_NAMES, JobBase, JobConfig

SCHEMAS: dict[str, type[JobBase]] = {
    "extension": JobConfig, "train": slider.SliderJob, "extract": extract.ExtractJob,
    "mod": mod.ModJob, "merge": mod.MergeJob, "generate": generate.GenerateJob,
}
# The process types each job kind runs (the rest of upstream's are refused).
PROCESS_TYPES: dict[str, tuple[str, ...]] = {
    "extension": ("sd_trainer", "ui_trainer", "diffusion_trainer", "concept_slider"),
    "train": ("slider",), "extract": ("locon", "lora"), "mod": ("rescale_lora",),
    "merge": ("merge_loras", "merge_into_model"), "generate": ("to_folder",),
}
DEFAULT_JOB = "extension"
# The kinds that train (into `training_folder/NAME`), and the file jobs, which write
# where their config says (the web UI confines them: aitk_server.configs).
TRAINING_KINDS = ("extension", "train")
FILE_KINDS = ("extract", "mod", "merge", "generate")

# Every section model -> its upstream section name (aitk.config.upstream_keys.SECTIONS).
SECTIONS: dict[type[BaseModel], str] = {
    **SECTION_NAMES, **slider.SECTIONS, **extract.SECTIONS, **mod.SECTIONS,
    **generate.SECTIONS}


def schema_for(job: Any) -> type[JobBase] | None:
    return SCHEMAS.get(str(job)) if isinstance(job, str) else None
