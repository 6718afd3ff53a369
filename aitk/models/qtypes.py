"""The weight types `model.qtype` / `model.qtype_te` name, said without torch.

The schema, the preflight, the memory forecast and the quantizer all read this one
table. Upstream AI Toolkit accepts three families of names (its toolkit/util/quantize.py
`get_qtype`), and aitk runs each through a well-kept library where one implements it:

- optimum-quanto: `qfloat8` (and its e4m3fn / e4m3fnuz / e5m2 forms), `qint8`, `qint4`,
  `qint2` (int4/int2 are packed in groups of 128 with a float scale and shift);
- torchao weight-only configs: `int8` (Int8WeightOnlyConfig, per-row scale) and `float8`
  (Float8WeightOnlyConfig, e4m3 with a per-row scale);
- `uint2` .. `uint8`: asymmetric affine integers in groups of 64 along the input axis
  with a scale (the weight's dtype) and an integer zero point per group, the scheme of
  torchao 0.10's UIntXWeightOnlyConfig that upstream's accuracy recovery adapters were
  fitted against. torchao computes the parameters (its affine primitives); torchao no
  longer ships a packed layout for them (0.18 keeps sub-8-bit codes in one byte each,
  which loses the memory these types exist for), so aitk packs the codes itself
  (aitk.models.uintx).

A qtype may carry an accuracy recovery adapter after a bar, `uint3|owner/repo/file`
(aitk.models.recovery_adapter). Upstream's own formats (`convrot*`, `nvfp4`, `orbit*`)
no library implements: each is refused with the nearest type aitk has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from aitk.errors import QuantizeError

Backend = Literal["quanto", "torchao", "uintx"]


@dataclass(frozen=True)
class QType:
    name: str
    backend: Backend
    bits: int  # bits per weight code
    group: int  # weights sharing one scale (0: one per output row)
    scale_bytes: int  # bytes of scale (+ zero point / shift) per group or row
    summary: str

    def weight_bytes(self, params: int, row: int = 3072) -> float:
        """Bytes `params` weights take quantized, scales included (`row`: the typical
        input width, for per-row scales)."""
        per_group = self.group or row
        return params * self.bits / 8 + params / per_group * self.scale_bytes


def _uintx(bits: int) -> QType:
    # scale in the weight dtype (2 bytes for bf16/fp16) + a one-byte zero point per 64
    return QType(f"uint{bits}", "uintx", bits, 64, 3,
                 f"{bits}-bit asymmetric integers, groups of 64 (aitk.models.uintx)")


QTYPE_LIST: tuple[QType, ...] = (
    QType("qfloat8", "quanto", 8, 0, 4, "float8 e4m3 with a per-row scale (optimum-quanto)"),
    QType("qfloat8_e4m3fn", "quanto", 8, 0, 4, "the same as qfloat8 (optimum-quanto)"),
    QType("qfloat8_e4m3fnuz", "quanto", 8, 0, 4, "float8 e4m3fnuz (optimum-quanto)"),
    QType("qfloat8_e5m2", "quanto", 8, 0, 4, "float8 e5m2 (optimum-quanto)"),
    QType("qint8", "quanto", 8, 0, 4, "int8 with a per-row scale (optimum-quanto)"),
    QType("qint4", "quanto", 4, 128, 4, "int4 in groups of 128 (optimum-quanto; a C++ "
          "kernel built once)"),
    QType("qint2", "quanto", 2, 128, 4, "int2 in groups of 128 (optimum-quanto; a C++ "
          "kernel built once)"),
    QType("int8", "torchao", 8, 0, 5, "int8 weight-only, per-row scale (torchao)"),
    QType("float8", "torchao", 8, 0, 4, "float8 e4m3 weight-only, per-row scale (torchao)"),
    *(_uintx(b) for b in range(2, 9)),
)
QTYPES: dict[str, QType] = {q.name: q for q in QTYPE_LIST}
QTYPE_NAMES: tuple[str, ...] = tuple(QTYPES)

# Upstream's own formats: no library implements them; the nearest type aitk has.
UNSUPPORTED: dict[str, str] = {
    "convrot4": "uint4", "convrot8": "qint8", "convrotbitnet": "uint2",
    "convrotcomfyw4a4": "uint4", **{f"convrotint{b}": f"uint{b}" for b in range(2, 9)},
    "nvfp4": "uint4", "orbit2": "uint2", "orbit3": "uint3", "orbit4": "uint4",
    "orbitvq2": "uint2", "orbitvq3": "uint3", "orbitvq4": "uint4",
}


class QTypeProblem(QuantizeError, ValueError):
    """A qtype value aitk cannot run: its message is the one line to show (a ValueError
    too, so the schema's validator reports it at its field)."""


@dataclass(frozen=True)
class QTypeChoice:
    """`model.qtype` as written: the weight type and an optional recovery adapter."""

    qtype: QType
    adapter: str | None = None  # local file, or owner/repo/path in a hub repo


def parse_qtype(value: str) -> QTypeChoice:
    """`uint3|owner/repo/file.safetensors` -> (uint3, that adapter); raises QTypeProblem
    naming the nearest supported type for a format no library implements."""
    name, bar, adapter = str(value).partition("|")
    name, adapter = name.strip(), adapter.strip()
    if bar and not adapter:
        raise QTypeProblem(f"{value!r}: nothing after '|' (an accuracy recovery adapter: "
                           "a .safetensors file or owner/repo/file)")
    if name in UNSUPPORTED:
        raise QTypeProblem(f"qtype {name!r} is upstream's own format, which no library "
                           f"implements; the nearest aitk runs is {UNSUPPORTED[name]!r}")
    if name not in QTYPES:
        raise QTypeProblem(f"unknown qtype {name!r}; choose one of {', '.join(QTYPE_NAMES)}")
    return QTypeChoice(QTYPES[name], adapter or None)
