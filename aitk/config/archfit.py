"""What a valid config must also fit: the facts of its arch.

The schema checks each field alone; these checks read the arch's torch-free description
(aitk.models.description) for what only the arch knows: the `train.noise_scheduler`
names it trains with, the clip lengths its video VAE packs (Wan: 4k+1 frames), and
whether it takes `model.attn_masking`.
Archs from extensions carry no description here and are not checked.
"""

from __future__ import annotations

from aitk.config.schema import JobBase, TrainingProcess
from aitk.models import catalog
from aitk.models.description import Frames


def arch_fit_problems(job: JobBase) -> list[str]:
    """One "path: message" line per setting a training process's arch cannot take (the
    file jobs, extract/mod/merge/generate, train nothing and are not checked)."""
    out: list[str] = []
    for i, proc in enumerate(job.processes):
        where = f"config.process[{i}]"
        if not isinstance(proc, TrainingProcess) or \
                proc.model.arch not in catalog.builtin_archs():
            continue
        out += _noise_scheduler(where, proc)
        out += _frames(where, proc)
        out += _attn_masking(where, proc)
    return out


def _attn_masking(where: str, proc: TrainingProcess) -> list[str]:
    caps = catalog.description(proc.model.arch).capabilities
    if not proc.model.attn_masking or (caps is not None and caps.attn_masking):
        return []
    return [f"{where}.model.attn_masking: {proc.model.arch} has no padded T5 prompt to "
            "mask (upstream's key is for flux); remove it"]


def _noise_scheduler(where: str, proc: TrainingProcess) -> list[str]:
    names = catalog.noise_schedulers(proc.model.arch)
    chosen = proc.train.noise_scheduler
    if chosen is None or chosen in names:
        return []
    also = f" (or upstream's other names for it: {', '.join(names[1:])})" if names[1:] else ""
    return [f"{where}.train.noise_scheduler: {proc.model.arch} trains with {names[0]!r}"
            f"{also}; got {chosen!r}"]


def _frames(where: str, proc: TrainingProcess) -> list[str]:
    caps = catalog.description(proc.model.arch).capabilities
    rule = caps.video if caps is not None else None
    if rule is None:  # an image arch: the run refuses num_frames > 1 with its own line
        return []
    datasets = getattr(proc, "datasets", [])  # a slider may have none
    asked = [(f"datasets[{i}].num_frames", ds.num_frames) for i, ds in enumerate(datasets)]
    return [f"{where}.{path}: {frame_problem(rule, n)}" for path, n in asked
            if not rule.allows(n)]


def frame_problem(rule: Frames, frames: int) -> str:
    below = max(1, (frames - 1) // rule.step * rule.step + 1)
    examples = ", ".join(str(rule.step * k + 1) for k in range(5))
    return (f"must be 1 or of the form {rule} ({examples}, ...); got {frames}: use "
            f"{below} or {below + rule.step}")
