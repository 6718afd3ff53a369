"""The optimizers a job can name (`train.optimizer`), as data: where each comes from, the
`optimizer_params` it takes, and what aitk passes when a setting is not given.

Torch-free, so the config schema validates `optimizer_params` per optimizer (a typo is a
config error naming the valid settings) and the preflight names a missing package
before anything loads. aitk.run.optim builds them from this table.

The names and defaults follow upstream's `toolkit/optimizer.py`, so an upstream config
trains with the settings it trained with there:

- Adam-family optimizers (adam, adamw, the 8-bit ones, prodigy, dadaptation) get
  `eps: 1e-6` unless set;
- the learning-rate-free ones (prodigy, dadaptation) take `lr` as a multiplier of their
  own estimate: an `lr` below 0.1 (a plain Adam rate, as the UI writes) becomes 1.0;
- automagic keeps a learning rate per weight between `min_lr` and `max_lr`, starting at
  `lr`; a start above 1e-3 is taken as a plain Adam rate and becomes 1e-6;
- adafactor runs with a fixed learning rate (`relative_step`, `scale_parameter` and
  `warmup_init` off), so `lr` and the LR schedule mean what they mean elsewhere.

Each spec also says how much state the optimizer keeps per trained weight between
steps (`state_copies` tensors shaped and typed like the weight, plus `state_bytes` per
weight in formats of their own): the memory forecast (aitk.memory.forecast) reads it,
for a LoRA's float32 adapter and a full fine-tune's weights alike. Where the figure
comes from is said at each spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Pair = tuple[float, float]
_ADAM = {"betas": Pair, "eps": float, "weight_decay": float}
_PRODIGY = {"betas": Pair, "beta3": float | None, "eps": float, "weight_decay": float,
            "decouple": bool, "use_bias_correction": bool, "safeguard_warmup": bool,
            "d0": float, "d_coef": float, "growth_rate": float}


@dataclass(frozen=True)
class Package:
    """A PyPI package an optimizer needs: its import name and its name on PyPI."""

    module: str
    name: str


BITSANDBYTES = Package("bitsandbytes", "bitsandbytes")
PRODIGYOPT = Package("prodigyopt", "prodigyopt")
LION = Package("lion_pytorch", "lion-pytorch")
DADAPTATION = Package("dadaptation", "dadaptation")


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    summary: str
    params: Mapping[str, Any]  # setting -> its type (pydantic validates the values)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    packages: tuple[Package, ...] = ()
    lr_free: bool = False  # lr is a multiplier of the optimizer's own step size
    # Optimizer state per trained weight, between steps (the module docstring).
    state_copies: float = 0.0  # tensors of the weight's shape and dtype
    state_bytes: float = 0.0  # bytes per weight in the optimizer's own formats

    def state_per_weight(self, weight_bytes: float) -> float:
        """Bytes of state per trained weight of `weight_bytes` bytes (4: float32)."""
        return self.state_copies * weight_bytes + self.state_bytes


# bitsandbytes' 8-bit state: a 1-byte code per value and a float32 scale per block of
# 256 values (its optimizers' block size; aitk.run.prodigy8bit uses the same).
_CODE_8BIT = 1 + 4 / 256


OPTIMIZERS: dict[str, OptimizerSpec] = {s.name: s for s in (
    # torch's Adam/AdamW: exp_avg and exp_avg_sq, zeros_like the weight (amsgrad: a third)
    OptimizerSpec("adamw", "torch AdamW", {**_ADAM, "amsgrad": bool},
                  {"eps": 1e-6, "weight_decay": 0.01}, state_copies=2),
    OptimizerSpec("adam", "torch Adam", {**_ADAM, "amsgrad": bool}, {"eps": 1e-6},
                  state_copies=2),
    # both moments as 8-bit codes (tensors under min_8bit_size, 4096 values, keep float32
    # moments: biases and norms, a negligible share)
    OptimizerSpec("adamw8bit", "bitsandbytes AdamW8bit: 8-bit optimizer state",
                  {**_ADAM, "min_8bit_size": int}, {"eps": 1e-6},
                  (BITSANDBYTES,), state_bytes=2 * _CODE_8BIT),
    OptimizerSpec("adam8bit", "bitsandbytes Adam8bit: 8-bit optimizer state",
                  {**_ADAM, "min_8bit_size": int}, {"eps": 1e-6}, (BITSANDBYTES,),
                  state_bytes=2 * _CODE_8BIT),
    # Lion keeps one moment (exp_avg)
    OptimizerSpec("lion", "Lion (lion-pytorch)",
                  {"betas": Pair, "weight_decay": float, "decoupled_weight_decay": bool},
                  packages=(LION,), state_copies=1),
    OptimizerSpec("lion8bit", "bitsandbytes Lion8bit: 8-bit optimizer state",
                  {"betas": Pair, "weight_decay": float, "min_8bit_size": int},
                  packages=(BITSANDBYTES,), state_bytes=_CODE_8BIT),
    # no first moment (beta1 unset); the second moment of an r x c matrix factored into
    # r + c float32 values: ~(r + c) / (r * c) * 4 bytes a weight, 0.25 for a rank-16
    # LoRA matrix (the figure here), ~0 for a full layer
    OptimizerSpec("adafactor", "transformers Adafactor (factored second moments)",
                  {"eps": Pair, "clip_threshold": float, "decay_rate": float,
                   "beta1": float | None, "weight_decay": float, "scale_parameter": bool,
                   "relative_step": bool, "warmup_init": bool},
                  {"relative_step": False, "scale_parameter": False,
                   "warmup_init": False}, state_bytes=0.25),
    # prodigyopt: exp_avg, exp_avg_sq, the running sum s and the start weights p0
    OptimizerSpec("prodigy", "Prodigy (prodigyopt): estimates its own step size",
                  {**_PRODIGY, "slice_p": int}, {"eps": 1e-6}, (PRODIGYOPT,),
                  lr_free=True, state_copies=4),
    # the same with both moments as 8-bit codes between steps (s and p0 as they are)
    OptimizerSpec("prodigy8bit", "Prodigy with its moments stored in 8 bits "
                  "(aitk.run.prodigy8bit)", _PRODIGY, {"eps": 1e-6},
                  (PRODIGYOPT, BITSANDBYTES), lr_free=True, state_copies=2,
                  state_bytes=2 * _CODE_8BIT),
    # aitk.run.automagic: a float32 rate and a bool sign per weight; its second moment
    # factored like Adafactor's (float32 per weight only for 1-D tensors)
    OptimizerSpec("automagic", "upstream's Automagic: a learning rate per weight, "
                  "adapted by sign agreement (aitk.run.automagic)",
                  {"min_lr": float, "max_lr": float, "lr_bump": float, "eps": Pair,
                   "clip_threshold": float, "beta2": float, "weight_decay": float},
                  state_bytes=5.0),
    # D-Adaptation Adam: exp_avg, exp_avg_sq and s; its Lion: exp_avg and s
    OptimizerSpec("dadaptation", "D-Adaptation Adam (dadaptation): estimates its own "
                  "step size", {**_ADAM, "decouple": bool, "use_bias_correction": bool,
                                "d0": float, "growth_rate": float}, {"eps": 1e-6},
                  (DADAPTATION,), lr_free=True, state_copies=3),
    OptimizerSpec("dadaptationlion", "D-Adaptation Lion (dadaptation)",
                  {"betas": Pair, "weight_decay": float, "d0": float},
                  packages=(DADAPTATION,), lr_free=True, state_copies=2),
)}
# Upstream's other spellings: its web UI writes `prodigyopt`; `adamw8`/`adam8` were its
# own 8-bit Adam, the same algorithm as bitsandbytes' (upstream's `adamw8` decouples the
# weight decay, like AdamW8bit).
ALIASES = {"prodigyopt": "prodigy", "adamw8": "adamw8bit", "adam8": "adam8bit"}
NAMES = tuple(OPTIMIZERS)


def canonical(name: str) -> str:
    lower = name.lower()
    return ALIASES.get(lower, lower)


AUTOMAGIC_MAX_START_LR = 1e-3


def effective_lr(spec: OptimizerSpec, lr: float) -> float:
    """The `lr` handed to the optimizer (see the module docstring)."""
    if spec.lr_free and lr < 0.1:
        return 1.0
    if spec.name == "automagic" and lr > AUTOMAGIC_MAX_START_LR:
        return 1e-6
    return lr


def missing_packages(spec: OptimizerSpec) -> list[Package]:
    import importlib.util

    return [p for p in spec.packages if importlib.util.find_spec(p.module) is None]


def unavailable_message(spec: OptimizerSpec, missing: list[Package]) -> str:
    names = " and ".join(p.name for p in missing)
    return (f"optimizer {spec.name} needs {names}, which {'is' if len(missing) == 1 else 'are'}"
            f" not installed here; run `python -m manager sync` (or `pip install "
            f"{' '.join(p.name for p in missing)}`), or choose another optimizer")
