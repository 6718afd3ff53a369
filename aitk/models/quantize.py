"""Weight quantization of nn.Linear layers, through the library each qtype names
(aitk.models.qtypes): optimum-quanto for `q*`, torchao's weight-only configs for `int8` /
`float8`, aitk.models.uintx (torchao's affine math, packed codes) for `uint2`..`uint8`.

`quantize_linear_layers(module, qtype, exclude)` quantizes the weights of every Linear
except modules whose name matches one of the `exclude` fnmatch patterns; activations
stay in the float dtype. It works one Linear at a time, block after block (each block of
a ModuleList, each other top-level child), so each layer's float weight is released as
soon as its quantized copy exists. aitk.models.quantized_loading goes one step further
and quantizes each block as it is read from the weights file, so the float model never
exists as a whole.

quanto's quantized matmul accepts only 2-D or 3-D activations. A network that applies a
Linear over a 4-D tensor (e.g. a (B, L, D, N) layer axis) must call `linear_nd(layer, x)`,
which flattens the leading axes to 3-D for the call and restores them afterwards; the
float model and the quantized one then behave the same.

quanto's qint4/qint2 need its C++ kernel, which torch builds on first use. torch writes
`-L<torch>/lib` unquoted into the ninja file, so in a checkout under "new user" the link
step fails; `prepare_quanto_kernel_build` points torch at a space-free symlink of that
folder and builds in a cache folder outside site-packages. A kernel that still cannot
build (no compiler) makes the qtype fall back to aitk's uint4/uint2 with one warning line
(`quanto_kernel_problem`).
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import torch
from torch import nn

from aitk.errors import QuantizeError
from aitk.models.qtypes import QTYPES, QType, QTypeProblem, parse_qtype

# quanto types whose kernel torch builds on first use, and aitk's stand-in for each.
KERNEL_QTYPES = {"qint4": "uint4", "qint2": "uint2"}


def resolve_qtype(name: str, warn: Callable[[str], None] | None = None) -> QType:
    """The QType to quantize with: `name` (a `|adapter` suffix ignored), or its stand-in
    when quanto's kernel cannot be built here (said once through `warn`)."""
    try:
        qtype = parse_qtype(name).qtype
    except QTypeProblem as exc:
        raise QuantizeError(str(exc)) from None
    if qtype.name in KERNEL_QTYPES:
        problem = quanto_kernel_problem()
        if problem:
            stand_in = KERNEL_QTYPES[qtype.name]
            (warn or _warn)(f"{qtype.name}: optimum-quanto's kernel did not build "
                            f"({problem}); quantizing to {stand_in} instead")
            return QTYPES[stand_in]
    return qtype


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def kernel_cache_dir() -> Path:
    """Where torch extensions are built: AITK_KERNEL_CACHE, else ~/.cache/aitk/kernels,
    else (a home with a space in its path) the temp folder; per torch version."""
    env = os.environ.get("AITK_KERNEL_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "aitk" / "kernels"
    if " " in str(base):
        base = Path(tempfile.gettempdir()) / f"aitk-kernels-{os.getuid()}"
    return base / f"torch-{torch.__version__}"


def torch_lib_link_name(lib: Path) -> str:
    """The space-free link's name for one torch's lib folder: one per checkout, so two
    checkouts sharing the kernel cache do not repoint each other's link."""
    import hashlib

    return f"torch-lib-{hashlib.sha256(str(lib).encode()).hexdigest()[:12]}"


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
            link = root / torch_lib_link_name(lib)
            # the cache outlives checkouts: a link another (since removed) one left at
            # this name is pointed at this torch again, replaced in one rename
            if not link.is_symlink() or os.readlink(link) != str(lib):
                fresh = root / f".{link.name}.{os.getpid()}"
                fresh.unlink(missing_ok=True)
                fresh.symlink_to(lib, target_is_directory=True)
                os.replace(fresh, link)
            cpp_extension.TORCH_LIB_PATH = str(link)
        get_extension("quanto_cpp").build_directory = str(root / "quanto_cpp")
    except OSError:  # a read-only home: quanto builds where it would have
        pass


@cache
def quanto_kernel_problem() -> str | None:
    """Build (or find built) quanto's kernel and run it once on a probe layer: None when
    it works, else why not in a few words (a compiler error, no toolchain)."""
    from optimum.quanto import freeze, qint4, quantize

    prepare_quanto_kernel_build()
    try:
        probe = nn.Sequential(nn.Linear(128, 8))
        quantize(probe, weights=qint4)
        freeze(probe)
        probe(torch.zeros(1, 128))
    except Exception as exc:  # the build's own errors are of many types
        return " ".join(str(exc).split())[-160:] or type(exc).__name__
    return None


def quantize_linear_layers(module: nn.Module, qtype: str = "qfloat8",
                           exclude: Sequence[str] = (),
                           progress: Callable[[str], None] | None = None,
                           prefix: str = "",
                           per_layer: Mapping[str, str] | None = None) -> nn.Module:
    """Quantize the weights of `module`'s Linear layers in place.

    Layers are swapped inside their parent, so `module` itself must be a container.
    `prefix` is `module`'s own name in the model, for matching `exclude`; `per_layer`
    gives some layers (by name in `module`) another qtype than `qtype`.
    """
    kind = resolve_qtype(qtype)
    if isinstance(module, nn.Linear):
        raise QuantizeError("quantize_linear_layers swaps layers inside their parent; "
                            "pass the module that holds the Linear")
    kinds = resolve_per_layer(per_layer)
    for name, unit in quantization_units(module):
        quantize_unit(module, name, unit, kind, exclude, prefix, kinds)
        release_freed_memory()
        if progress is not None:
            progress(name)
    return module


def resolve_per_layer(per_layer: Mapping[str, str] | None) -> dict[str, QType]:
    """Layer name -> QType, each qtype resolved once."""
    resolved = {q: resolve_qtype(q) for q in set((per_layer or {}).values())}
    return {name: resolved[q] for name, q in (per_layer or {}).items()}


def quantize_unit(root: nn.Module, name: str, unit: nn.Module, kind: QType,
                  exclude: Sequence[str] = (), prefix: str = "",
                  kinds: Mapping[str, QType] | None = None) -> None:
    """Quantize the Linear layers of `unit` (at `root.<name>`) that no `exclude` pattern
    matches (to `kinds[layer]`, else `kind`), one at a time: quantizing needs float32
    temporaries of the layer being done, never of a whole block."""
    for full in _linear_names(unit, name, exclude, prefix):
        quantize_layer(root, full, (kinds or {}).get(full, kind))
        # Per layer: the freed float weight and quantization temporaries go back to the
        # OS before the next layer allocates its own (else the block's peak doubles).
        release_freed_memory()


def quantize_layer(root: nn.Module, name: str, kind: QType) -> None:
    """Quantize the Linear at `root.<name>` to `kind`, in place."""
    parent_name, _, leaf = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    layer = parent.get_submodule(leaf)
    if kind.backend == "quanto":
        import optimum.quanto as quanto

        quanto.quantize(parent, weights=getattr(quanto, kind.name), include=[leaf])
        quanto.freeze(parent.get_submodule(leaf))
    elif kind.backend == "torchao":
        from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

        config = Int8WeightOnlyConfig() if kind.name == "int8" else Float8WeightOnlyConfig()
        quantize_(layer, config)
    else:
        from aitk.models.uintx import UIntXLinear, can_quantize

        if can_quantize(layer):  # upstream's rule: other widths stay in float
            setattr(parent, leaf, UIntXLinear(layer, kind.bits))


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


def _linear_names(unit: nn.Module, name: str, exclude: Sequence[str],
                  prefix: str = "") -> list[str]:
    """Names (relative to the quantized root) of the Linear layers in `unit` that no
    `exclude` pattern matches (patterns see the name from the model's root)."""
    names = []
    for rel, child in unit.named_modules():
        full = f"{name}.{rel}" if rel else name
        model_name = f"{prefix}.{full}" if prefix else full
        if isinstance(child, nn.Linear) and not _is_quantized_layer(child) and \
                not any(fnmatch(model_name, p) for p in exclude):
            names.append(full)
    return names


def _is_quantized_layer(layer: nn.Module) -> bool:
    from aitk.models.uintx import UIntXLinear

    if isinstance(layer, UIntXLinear) or type(layer).__module__.startswith("optimum.quanto"):
        return True
    weight = getattr(layer, "weight", None)
    return weight is not None and type(weight).__module__.startswith("torchao")


def quantization_units(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The pieces quantized (and loaded, aitk.models.quantized_loading) one after
    another: every block of a block list (a ModuleList or Sequential, at the top or
    inside a child such as a text encoder's `encoder`), and each other child whole."""
    units: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        full = f"{prefix}{name}"
        if isinstance(child, nn.ModuleList | nn.Sequential):
            units += [(f"{full}.{i}", block) for i, block in enumerate(child)]
        elif any(isinstance(m, nn.ModuleList | nn.Sequential) for m in child.modules()):
            units += quantization_units(child, f"{full}.")
        else:
            units.append((full, child))
    return units


def tensor_bytes(t: torch.Tensor) -> int:
    """Storage bytes of a tensor, looking inside quantized tensor subclasses (quanto's
    and torchao's: int8/fp8 data, packed int4 data, scales, shifts)."""
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
    return any(_is_quantized_layer(m) for m in module.modules() if isinstance(m, nn.Linear))


def linear_nd(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a (possibly quantized) Linear to an input of any rank >= 2."""
    if x.dim() <= 3:
        return layer(x)
    lead = x.shape[:-1]
    out = layer(x.reshape(lead[0], -1, x.shape[-1]))
    return out.reshape(*lead, out.shape[-1])
