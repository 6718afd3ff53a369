"""FLUX.2's timestep shift: the pipeline's empirical mu instead of a line over tokens.

Flux2KleinPipeline sets mu from the image token count AND the number of sampling steps
(diffusers' `compute_empirical_mu`, fitted at 10 and 200 steps), then shifts sigmas
exponentially (the scheduler's `time_shift_type`). Training has no step count, so
`num_steps` is the one the model is sampled with (see the model's `shift_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aitk.diffusion.timesteps import FlowShift


@dataclass(frozen=True)
class EmpiricalShift(FlowShift):
    num_steps: int = 50

    @classmethod
    def from_scheduler_config(cls, config: Any, num_steps: int = 50) -> EmpiricalShift:
        base = FlowShift.from_scheduler_config(config)
        return cls(shift=base.shift, dynamic=True, exponential=base.exponential,
                   num_steps=num_steps)

    def mu(self, image_seq_len: int) -> float:
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

        return compute_empirical_mu(image_seq_len, self.num_steps)
