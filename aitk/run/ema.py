"""`train.ema_config`: an exponential moving average of the adapter's weights.

    ema = AdapterEMA(network.trainable_parameters(), decay=0.999)
    ema.update()                 # after every optimizer step
    with ema.applied(): ...      # the averaged weights in place (save, preview, validate)
    ema.state_dict()             # kept in the checkpoint beside the raw weights

diffusers' `EMAModel` does the averaging, at a constant decay (its warm-up is off:
`min_decay` = `decay`): e = e - (1 - decay) (e - w) after each step, the first update
copying the weights (upstream starts the average at the untrained weights instead; one
step apart, the two are the same in practice). The raw weights keep training; the
average is what the LoRA files hold and the previews show, as upstream. A checkpoint
keeps both, so a resume continues the same average exactly.

Upstream's two switches act on the trained weights after each update (toolkit/ema.py):
`use_feedback` moves them toward the average as it stood before the update by
10 x (1 - decay) of the gap, and `param_multiplier` then scales them (a negative weight
decay; upstream means it for adapters without biases, such as a LoRA). Both change only
the trained weights, which a checkpoint keeps, so a resume stays exact with them on.
Feedback holds one more copy of the trained weights while it updates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

# Upstream's feedback is ten times the average's own step toward the weights.
FEEDBACK_GAIN = 10.0


class AdapterEMA:
    def __init__(self, params: Iterable[torch.nn.Parameter], decay: float,
                 feedback: bool = False, param_multiplier: float = 1.0) -> None:
        from diffusers.training_utils import EMAModel

        self.params = list(params)
        self.decay = float(decay)
        self.feedback = feedback
        self.param_multiplier = float(param_multiplier)
        self.average = EMAModel(self.params, decay=self.decay, min_decay=self.decay,
                                foreach=True)

    def restarted(self) -> AdapterEMA:
        """A new average of the same weights with the same settings."""
        return AdapterEMA(self.params, self.decay, self.feedback, self.param_multiplier)

    @torch.no_grad()
    def update(self) -> None:
        # The gap is taken before the average moves: upstream pulls toward the old one.
        gap = (torch._foreach_sub(list(self.average.shadow_params), self.params)
               if self.feedback else None)
        self.average.step(self.params)
        if gap is not None:
            torch._foreach_add_(self.params, gap, alpha=FEEDBACK_GAIN * (1.0 - self.decay))
        if self.param_multiplier != 1.0:
            torch._foreach_mul_(self.params, self.param_multiplier)

    @property
    def weights(self) -> list[torch.Tensor]:
        """The averaged weights, in the order of the adapter's parameters."""
        return list(self.average.shadow_params)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the adapter inside the block, the trained ones back
        after it (even on error)."""
        self.average.store(self.params)
        self.average.copy_to(self.params)
        try:
            yield
        finally:
            self.average.restore(self.params)

    def state_dict(self) -> dict[str, Any]:
        state = self.average.state_dict()
        state["shadow_params"] = [p.detach().to("cpu") for p in state["shadow_params"]]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average.load_state_dict(state)
        # This run's decay, not the one the checkpoint was trained with.
        self.average.decay = self.average.min_decay = self.decay
        device = self.params[0].device if self.params else torch.device("cpu")
        self.average.to(device)
