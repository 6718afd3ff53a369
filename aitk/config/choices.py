"""Allowed values that the config schema, the code and the README share.

Kept free of torch imports: the config schema reads them before any model loads.
"""

from __future__ import annotations

# train.timestep_type (aitk.diffusion.timesteps documents each one).
TIMESTEP_TYPES = ("sigmoid", "logit_normal", "linear", "uniform", "weighted", "shift",
                  "flux_shift", "lumina2_shift", "lognorm_blend", "next_sample")
# train.content_or_style: which end of the noise range timesteps lean to (upstream's
# names; the web form calls them Balanced, High Noise, Low Noise).
TIMESTEP_BIASES = ("balanced", "content", "style")
# train.loss_type (aitk.diffusion.losses documents each one).
LOSS_TYPES = ("mse", "mae", "pseudo_huber", "wavelet", "stepped")
# train.lr_scheduler (aitk.run.optim.lr_at computes each one from the step alone).
LR_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine",
                 "cosine_with_restarts", "step")
# datasets[].augments (aitk.data.augment implements each one).
AUGMENTS = ("ColorJitter", "RandomEqualize")
