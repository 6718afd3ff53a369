"""Weight quantization of nn.Linear layers through optimum-quanto.

`quantize_linear_layers(module, qtype, exclude)` quantizes the weights of every Linear
(quanto's `quantize` + `freeze`, so the float weights are dropped) except modules whose
name matches one of the `exclude` fnmatch patterns. Activations stay in the float dtype.

It works one Linear at a time, block after block (each block of a ModuleList, each
other top-level child): quantize, then freeze that layer before the next, so its float
weights are released as soon as its quantized copy exists. Float and quantized copies of the whole
model never coexist; the peak is the float model plus one layer's quantization temporaries
(bench/quantize_memory.py measures it).

quanto's quantized matmul accepts only 2-D or 3-D activations. A network that applies a
Linear over a 4-D tensor (e.g. a (B, L, D, N) layer axis) must call `linear_nd(layer, x)`,
which flattens the leading axes to 3-D for the call and restores them afterwards; the
float model and the quantized one then behave the same.

quanto's qint4/qint2 need its C++ kernel, which torch builds on first use. torch writes
`-L<torch>/lib` unquoted into the ninja file, so in a checkout under "new user" the link
step fails; `prepare_quanto_kernel_build` points torch at a space-free symlink of that
folder and builds in a cache folder outside site-packages.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import torch
from torch import nn

from aitk.config.choices import QTYPES
from aitk.errors import QuantizeError


def _qtype(name: str):  # -> optimum.quanto.qtype
    if name not in QTYPES:
        raise QuantizeError(f"unknown qtype {name!r}; choose one of {', '.join(QTYPES)}")
    try:
        import optimum.quanto as quanto
    except ImportError as exc:  # pragma: no cover - it is a pinned requirement
        raise QuantizeError("quantize needs optimum-quanto (pip install optimum-quanto)"
                            ) from exc
    if name in KERNEL_QTYPES:
        prepare_quanto_kernel_build()
    return getattr(quanto, name)


# quanto types whose C++ kernel torch builds on first use.
KERNEL_QTYPES = ("qint4", "qint2")


def kernel_cache_dir() -> Path:
    """Where torch extensions are built: AITK_KERNEL_CACHE, else ~/.cache/aitk/kernels,
    else (a home with a space in its path) the temp folder; per torch version."""
    env = os.environ.get("AITK_KERNEL_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "aitk" / "kernels"
    if " " in str(base):
        base = Path(tempfile.gettempdir()) / f"aitk-kernels-{os.getuid()}"
    return base / f"torch-{torch.__version__}"


@cache
def prepare_quanto_kernel_build() -> None:
    """Make torch's build of quanto's kernel work from a path with a space (see the
    module docstring); a failure here leaves quanto's own defaults."""
    import torch.utils.cpp_extension as cpp_extension
    from optimum.quanto.library.extensions import get_extension

    root = kernel_cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lib = Path(cpp_extension.TORCH_LIB_PATH)
        if " " in str(lib):
            link = root / "torch-lib"
            if not link.is_symlink():
                link.symlink_to(lib, target_is_directory=True)
            cpp_extension.TORCH_LIB_PATH = str(link)
        get_extension("quanto_cpp").build_directory = str(root / "quanto_cpp")
    except OSError:  # a read-only home: quanto builds where it would have
        pass


def quantize_linear_layers(module: nn.Module, qtype: str = "qfloat8",
                           exclude: Sequence[str] = (),
                           progress: Callable[[str], None] | None = None) -> nn.Module:
    """Quantize the weights of `module`'s Linear layers in place and freeze them.

    Layers are swapped inside their parent, so `module` itself must be a container.
    """
    from optimum.quanto import freeze, quantize

    weights = _qtype(qtype)
    if isinstance(module, nn.Linear):
        raise QuantizeError("quantize_linear_layers swaps layers inside their parent; "
                            "pass the module that holds the Linear")
    for name, unit in quantization_units(module):
        for full in _linear_names(unit, name, exclude):
            # One Linear at a time, swapped inside its own parent: quantizing needs
            # float32 temporaries of the layer being done, never of a whole block.
            parent_name, _, leaf = full.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            quantize(parent, weights=weights, include=[leaf])
            freeze(parent.get_submodule(leaf))
            release_freed_memory()
        if progress is not None:
            progress(name)
    return module


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc's malloc_trim; a no-op elsewhere).

    glibc raises its mmap threshold after large frees, so the quantized weights land in
    the heap between the freed float weights, and without a trim the process keeps the
    float model's pages: measured on a 220M Flux transformer, RSS after qfloat8 stayed
    at 1.4x the bf16 model without it, 0.55x with it (bench/quantize_memory.py).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # musl or another libc: nothing to do
        pass


def _linear_names(unit: nn.Module, prefix: str, exclude: Sequence[str]) -> list[str]:
    """Full names of the Linear layers in `unit` that no `exclude` pattern matches."""
    names = []
    for rel, child in unit.named_modules():
        full = f"{prefix}.{rel}" if rel else prefix
        if isinstance(child, nn.Linear) and not any(fnmatch(full, p) for p in exclude):
            names.append(full)
    return names


def quantization_units(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The pieces quantized one after another: every block of a top-level ModuleList or
    Sequential, and each other top-level child as a whole."""
    units: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        if isinstance(child, nn.ModuleList | nn.Sequential):
            units += [(f"{name}.{i}", block) for i, block in enumerate(child)]
        else:
            units.append((name, child))
    return units


def tensor_bytes(t: torch.Tensor) -> int:
    """Storage bytes of a tensor, looking inside quanto's quantized tensor subclasses
    (int8/fp8 data, packed int4 data, scales, shifts)."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def weight_bytes(module: nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (quantized ones included)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(tensor_bytes(t) for t in tensors.values())


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
