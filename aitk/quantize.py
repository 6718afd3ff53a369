"""Weight quantization of nn.Linear layers through optimum-quanto.

`quantize_linear_layers(module, qtype, exclude)` quantizes the weights of every Linear
(quanto's `quantize` + `freeze`, so the float weights are dropped) except modules whose
name matches one of the `exclude` fnmatch patterns. Activations stay in the float dtype.

quanto's quantized matmul accepts only 2-D or 3-D activations. A network that applies a
Linear over a 4-D tensor (e.g. a (B, L, D, N) layer axis) must call `linear_nd(layer, x)`,
which flattens the leading axes to 3-D for the call and restores them afterwards; the
float model and the quantized one then behave the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from aitk.choices import QTYPES


class QuantizeError(ValueError):
    """An unknown qtype, or optimum-quanto missing."""


def _qtype(name: str):  # -> optimum.quanto.qtype
    if name not in QTYPES:
        raise QuantizeError(f"unknown qtype {name!r}; choose one of {', '.join(QTYPES)}")
    try:
        import optimum.quanto as quanto
    except ImportError as exc:  # pragma: no cover - it is a pinned requirement
        raise QuantizeError("quantize needs optimum-quanto (pip install optimum-quanto)"
                            ) from exc
    return getattr(quanto, name)


def quantize_linear_layers(module: nn.Module, qtype: str = "qfloat8",
                           exclude: Sequence[str] = ()) -> nn.Module:
    """Quantize the weights of `module`'s Linear layers in place and freeze them.

    Layers are swapped inside their parent, so `module` itself must be a container.
    """
    from optimum.quanto import freeze, quantize

    weights = _qtype(qtype)
    if isinstance(module, nn.Linear):
        raise QuantizeError("quantize_linear_layers swaps layers inside their parent; "
                            "pass the module that holds the Linear")
    quantize(module, weights=weights, exclude=list(exclude) or None)
    freeze(module)
    return module


def is_quantized(module: nn.Module) -> bool:
    from optimum.quanto import QModuleMixin

    return any(isinstance(m, QModuleMixin) for m in module.modules())


def linear_nd(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a (possibly quantized) Linear to an input of any rank >= 2."""
    if x.dim() <= 3:
        return layer(x)
    lead = x.shape[:-1]
    out = layer(x.reshape(lead[0], -1, x.shape[-1]))
    return out.reshape(*lead, out.shape[-1])
