"""The job kinds (aitk.config.kinds) -> the function that runs one of their processes,
imported only when a job of that kind runs. Training kinds run in aitk.run (the loop,
checkpoints, resume); the others here, each through the same job runner
(aitk.run.job.run_job: signals, the run record, the status file, exit codes):

    extract.py    a LoRA from two models' difference, layer by layer
    merge.py      rescale a LoRA (job: mod), merge LoRAs into one or into a model
    generate.py   prompts to a folder of images

Every runner takes (loaded, proc, stop, stream, world, status) and returns an
aitk.run.train.Outcome.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

RUNNERS: dict[str, str] = {
    "extension": "aitk.run.process:run_process", "train": "aitk.run.process:run_process",
    "extract": "aitk.jobs.extract:run_process", "mod": "aitk.jobs.merge:run_rescale",
    "merge": "aitk.jobs.merge:run_process", "generate": "aitk.jobs.generate:run_process",
}


def runner_for(kind: str) -> Callable[..., Any]:
    module, _, name = RUNNERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)
