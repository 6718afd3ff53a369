"""LoRA files as data, in the file's own key layout: read, grouped per module, rescaled,
merged, written back under the same names, so the result loads wherever the input did.
No model is needed (aitk.adapters.hooks applies a file to a model).

A module is the key stem before a LoRA suffix:

    <stem>.lora_A.weight + <stem>.lora_B.weight      peft / diffusers (down, up)
    <stem>.lora_down.weight + <stem>.lora_up.weight  kohya
    <stem>.alpha                                     optional: scale = alpha / rank
                                                     (absent: 1, as diffusers reads it)
    <stem>.lokr_w1[_a/_b] + <stem>.lokr_w2[_a/_b]    LoKr (rescaled only)

The delta a module adds to its layer's weight is scale * up @ down (a conv's down keeps
the kernel, its up is 1x1). `read_layout` reads only the header and needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aitk.errors import LoraFileError

if TYPE_CHECKING:
    import torch

DOWN = (".lora_A.weight", ".lora_down.weight")
UP = (".lora_B.weight", ".lora_up.weight")
ALPHA = ".alpha"
LOKR = (".lokr_w1_a", ".lokr_w1_b", ".lokr_w2_a", ".lokr_w2_b", ".lokr_w1", ".lokr_w2",
        ".lokr_t2")
STYLES = {DOWN[0]: "peft (lora_A/lora_B)", DOWN[1]: "kohya (lora_down/lora_up)"}


def split_key(key: str) -> tuple[str, str]:
    """`a.b.lora_A.weight` -> (`a.b`, `.lora_A.weight`)."""
    for suffix in (*DOWN, *UP, ALPHA, *LOKR):
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], suffix
    raise LoraFileError(f"key {key!r} is not a LoRA weight (lora_A/lora_B, "
                        "lora_down/lora_up, lokr_*, alpha)")


@dataclass(frozen=True)
class Layout:
    """What a file's keys look like: the suffix style and the prefix family."""

    style: str  # "peft (lora_A/lora_B)", "kohya (lora_down/lora_up)" or "lokr"
    prefix: str  # `transformer.`, `diffusion_model.`, `lora_unet_`, ...
    modules: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.style} keys under {self.prefix!r}"


def _prefix(stem: str) -> str:
    if stem.startswith("lora_") and "." not in stem:  # kohya: lora_unet_..., lora_te1_...
        return "_".join(stem.split("_")[:2]) + "_"
    return stem.split(".", 1)[0] + "."


def layout_of(keys: Sequence[str]) -> Layout:
    stems: dict[str, set[str]] = {}
    for key in keys:
        stem, suffix = split_key(key)
        stems.setdefault(stem, set()).add(suffix)
    if not stems:
        raise LoraFileError("holds no LoRA weights")
    suffixes = set().union(*stems.values())
    if suffixes & set(LOKR):
        style = "lokr"
    else:
        styles = {STYLES[s] for s in suffixes if s in STYLES}
        if len(styles) != 1:
            raise LoraFileError("mixes lora_A/lora_B and lora_down/lora_up keys" if styles
                                else "has alpha keys but no LoRA weights")
        style = styles.pop()
    prefixes = sorted({_prefix(s) for s in stems})
    return Layout(style, "|".join(prefixes), tuple(sorted(stems)))


def read_layout(path: Path) -> Layout:
    """The file's layout from its header alone (no torch, no tensor read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as fh:
            keys = list(fh.keys())
    except Exception as exc:  # safetensors raises several types for a torn file
        raise LoraFileError(f"{path} is not a readable safetensors file ({exc})") from None
    try:
        return layout_of(keys)
    except LoraFileError as exc:
        raise LoraFileError(f"{path} {exc}") from None


@dataclass
class LoraModule:
    """One layer's LoRA: scale * up @ down."""

    down: torch.Tensor
    up: torch.Tensor
    alpha: float | None  # None: the file has no alpha for it (scale 1)
    style: tuple[str, str] = (DOWN[0], UP[0])  # the suffixes it is written with

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])

    @property
    def scale(self) -> float:
        return 1.0 if self.alpha is None else self.alpha / self.rank

    def delta(self) -> torch.Tensor:
        """The weight difference (float32), shaped like the layer's weight."""
        down = self.down.float().reshape(self.rank, -1)
        up = self.up.float().reshape(self.up.shape[0], self.rank)
        product = (up @ down) * self.scale
        return product.reshape(self.up.shape[0], *self.down.shape[1:])


@dataclass
class LoraFile:
    """A LoRA file's modules by stem (LoRA pairs; LoKr factors kept as read)."""

    modules: dict[str, LoraModule]
    lokr: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # stem -> part
    metadata: dict[str, str] = field(default_factory=dict)
    layout: Layout | None = None

    @classmethod
    def read(cls, path: Path) -> LoraFile:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", device="cpu") as fh:
                metadata = dict(fh.metadata() or {})
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except Exception as exc:  # safetensors raises several types for a torn file
            raise LoraFileError(f"{path} is not a readable safetensors file ({exc})"
                                ) from None
        try:
            return cls.from_tensors(tensors, metadata)
        except LoraFileError as exc:
            raise LoraFileError(f"{path}: {exc}") from None

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor],
                     metadata: Mapping[str, str] | None = None) -> LoraFile:
        layout = layout_of(list(tensors))
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            stem, suffix = split_key(key)
            parts.setdefault(stem, {})[suffix] = value
        modules, lokr = {}, {}
        for stem, found in parts.items():
            alpha = float(found[ALPHA]) if ALPHA in found else None
            if any(s in found for s in LOKR):
                lokr[stem] = found
                continue
            pair = next(((d, u) for d, u in zip(DOWN, UP, strict=True)
                         if d in found and u in found), None)
            if pair is None:
                raise LoraFileError(f"module {stem!r} lacks its down or up weight")
            modules[stem] = LoraModule(found[pair[0]], found[pair[1]], alpha, pair)
        return cls(modules, lokr, dict(metadata or {}), layout)

    def tensors(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The file's keys again (weights in `dtype` when given; alphas float32)."""
        import torch

        def cast(t: torch.Tensor) -> torch.Tensor:
            return (t if dtype is None else t.to(dtype)).contiguous()

        out: dict[str, torch.Tensor] = {}
        for stem, m in self.modules.items():
            out[stem + m.style[0]] = cast(m.down)
            out[stem + m.style[1]] = cast(m.up)
            if m.alpha is not None:
                out[stem + ALPHA] = torch.tensor(float(m.alpha), dtype=torch.float32)
        for stem, found in self.lokr.items():
            for suffix, value in found.items():
                out[stem + suffix] = value.float() if suffix == ALPHA else cast(value)
        return out

    def write(self, path: Path, metadata: Mapping[str, str],
              dtype: torch.dtype | None = None) -> None:
        from safetensors.torch import save

        from aitk_common.files import atomic_write_bytes

        atomic_write_bytes(path, save(self.tensors(dtype), metadata=dict(metadata)))


# ---- arithmetic -------------------------------------------------------------------------
def rescaled(lora: LoraFile, scale: float, target: str = "up_down") -> LoraFile:
    """The LoRA whose effect at weight 1 is `lora`'s at weight `scale`. `up_down`
    multiplies down by sqrt|scale| and up by sign(scale) sqrt|scale| (both stay the same
    size, which fp16 likes); `alpha` multiplies each alpha (writing one where the file
    has none). A LoKr module has its first factor scaled."""
    import math

    root, sign = math.sqrt(abs(scale)), math.copysign(1.0, scale)
    modules = {}
    for stem, m in lora.modules.items():
        if target == "alpha":
            alpha = (m.alpha if m.alpha is not None else float(m.rank)) * scale
            modules[stem] = LoraModule(m.down, m.up, alpha, m.style)
        else:
            modules[stem] = LoraModule(m.down * root, m.up * (sign * root), m.alpha, m.style)
    lokr = {}
    for stem, found in lora.lokr.items():
        first = ".lokr_w1" if ".lokr_w1" in found else ".lokr_w1_a"
        lokr[stem] = {**found, first: found[first] * scale}
    return LoraFile(modules, lokr, dict(lora.metadata), lora.layout)


@dataclass(frozen=True)
class MergeReport:
    rank: int  # the largest rank written
    max_error: float  # worst layer's relative error (0 for the exact merge)
    mean_error: float


def merged(loras: Sequence[tuple[LoraFile, float]], rank: int | None = None
           ) -> tuple[LoraFile, MergeReport]:
    """Several LoRAs of one layout, weighted, as one. rank None: exact, the ranks side by
    side (down stacked, up stacked times weight x scale, alpha = the total rank), so its
    delta is exactly the weighted sum of theirs; a rank: each layer's sum reduced to it
    by SVD (aitk.adapters.svd.truncate), the relative error reported."""
    import torch

    from aitk.adapters.svd import truncate

    if not loras:
        raise LoraFileError("nothing to merge")
    layouts = {str(f.layout) for f, _ in loras}
    if any(f.lokr for f, _ in loras):
        raise LoraFileError("LoKr files can be rescaled, not merged into one LoRA")
    if len({f.layout.style for f, _ in loras if f.layout}) > 1:
        raise LoraFileError(f"LoRAs in different layouts ({'; '.join(sorted(layouts))}) do "
                            "not merge into one file")
    stems = sorted({s for f, _ in loras for s in f.modules})
    modules, errors = {}, []
    for stem in stems:
        parts = [(f.modules[stem], w) for f, w in loras if stem in f.modules]
        first = parts[0][0]
        for m, _ in parts[1:]:
            if m.up.shape[0] != first.up.shape[0] or m.down.shape[1:] != first.down.shape[1:]:
                raise LoraFileError(f"module {stem!r}: shapes differ between the LoRAs "
                                    f"({tuple(first.delta().shape)} vs "
                                    f"{tuple(m.delta().shape)}); are they for one model?")
        down = torch.cat([m.down.float() for m, _ in parts], 0)
        up = torch.cat([m.up.float() * (w * m.scale) for m, w in parts], 1)
        if rank is not None and rank < down.shape[0]:
            factors = truncate(down, up, rank)
            down, up = factors.down, factors.up
            errors.append(factors.error)
        else:
            errors.append(0.0)
        modules[stem] = LoraModule(down, up, float(down.shape[0]), first.style)
    ranks = [m.rank for m in modules.values()]
    report = MergeReport(max(ranks), max(errors), sum(errors) / len(errors))
    return LoraFile(modules, {}, dict(loras[0][0].metadata), loras[0][0].layout), report
