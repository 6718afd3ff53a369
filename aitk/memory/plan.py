"""A job's process config as the memory forecast's `Plan` (aitk.memory.forecast), and the
free memory it is compared with, without torch unless a GPU must be asked.

Part sizes: a local model folder's own safetensors headers (shapes only: a few KB read
per file, no weights), else the arch description's variant whose hub repo the job names
(aitk/models/<arch>/arch.py), else the arch's first variant (an estimate, said so).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aitk.config.schema import TrainingProcess
from aitk.errors import ModelKwargsError
from aitk.memory.forecast import Forecast, PartLoad, Plan, forecast
from aitk.models.description import ArchDescription, Part, PartRole, Variant

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own cap on the JSON header
_BLOCK_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(\d+)\.")  # a top-level list's item


# safetensors dtype codes -> bytes per element
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2,
               "BF16": 2, "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1,
               "BOOL": 1}


@dataclass(frozen=True)
class Counted:
    params: int
    blocks: int
    block_params: int
    file_bytes: int | None = None  # None: not read from files


def header_shapes(path: Path) -> dict[str, tuple[list[int], str]]:
    """{tensor name: (shape, dtype)} from a .safetensors file's header (8-byte length +
    JSON)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            return {}
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            return {}
        header = json.loads(fh.read(length))
    return {k: (v["shape"], v["dtype"]) for k, v in header.items() if k != "__metadata__"}


def count_folder(folder: Path) -> Counted | None:
    """Parameters of a part folder's safetensors files, and those of its repeated blocks
    (tensors named `<list>.<index>.`: the items of its top-level ModuleLists)."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    total = in_blocks = size = 0
    blocks: set[tuple[str, str]] = set()
    for file in files:
        try:
            shapes = header_shapes(file)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        for name, (shape, dtype) in shapes.items():
            n = 1
            for dim in shape:
                n *= int(dim)
            total += n
            size += n * DTYPE_BYTES.get(str(dtype), 2)
            match = _BLOCK_KEY.match(name)
            if match:
                blocks.add(match.groups())
                in_blocks += n
    return Counted(total, len(blocks), in_blocks, size)


def pick_variant(desc: ArchDescription, name_or_path: str) -> tuple[Variant | None, bool]:
    """(the variant, whether the job names it) for a hub id or folder."""
    for variant in desc.variants:
        if name_or_path in variant.repos:
            return variant, True
    return (desc.variants[0] if desc.variants else None), False


def part_sizes(desc: ArchDescription, name_or_path: str) -> tuple[list[tuple[Part, Counted]],
                                                                   bool]:
    """Each part's role and sizes; and whether they are exact (the folder's own files or
    the named variant) rather than the arch's first variant."""
    variant, named = pick_variant(desc, name_or_path)
    if variant is None:
        return [], False
    root = Path(name_or_path).expanduser()
    out, exact = [], named
    for part in variant.parts:
        counted = count_folder(root / part.subfolder) if root.is_dir() else None
        if counted is None:
            counted = Counted(part.resident_params or 0, part.blocks, part.block_params)
        else:
            exact = True
        out.append((part, counted))
    return out, exact


def resolutions(proc: TrainingProcess) -> tuple[int, int]:
    """(the largest side trained at, the most frames): the datasets', else a slider's
    own latents (`slider.resolutions`, single images)."""
    if proc.datasets:
        return (max(r for ds in proc.datasets for r in ds.resolutions),
                max(ds.num_frames for ds in proc.datasets))
    slider = getattr(proc, "slider", None)
    sides = [side for pair in getattr(slider, "resolutions", ()) for side in pair]
    return (max(sides) if sides else 512), 1


def plan_of(proc: TrainingProcess, desc: ArchDescription, device: str,
            device_free: int | None, host_free: int | None) -> Plan | None:
    """The Plan of one process (a LoRA, a full fine-tune, either slider), or None when
    the arch describes no sizes."""
    m, tr = proc.model, proc.train
    sizes, _ = part_sizes(desc, m.name_or_path)
    if not sizes:
        return None
    train_dtype = "fp32" if tr.dtype in ("fp32", "float32") else "bf16"
    cached = tr.cache_text_embeddings or tr.unload_text_encoder or any(
        ds.cache_text_embeddings for ds in proc.datasets)
    parts = []
    denoiser_seen = False
    for part, counted in sizes:
        load_as = "fp32" if part.float32 else train_dtype
        stored_as, share, idle = load_as, 0.0, False
        if part.role is PartRole.DENOISER:
            if m.quantize:
                stored_as = m.qtype
            if m.layer_offloading:
                share = m.layer_offloading_transformer_percent
            idle = m.low_vram and denoiser_seen  # an idle expert waits on the CPU
            denoiser_seen = True
        elif part.role is PartRole.TEXT_ENCODER:
            if m.quantize_te:
                stored_as = m.qtype_te
            if m.layer_offloading:
                share = m.layer_offloading_text_encoder_percent
            idle = m.low_vram
        else:
            if part.role is PartRole.GUIDANCE and m.quantize:
                stored_as = m.qtype  # quantized as the denoiser is
            idle = m.low_vram
        parts.append(PartLoad(
            part.subfolder, part.role.value, counted.params, counted.blocks,
            counted.block_params, load_as, stored_as, share, idle,
            dropped_after_caching=cached and part.role is PartRole.TEXT_ENCODER,
            file_bytes=counted.file_bytes))
    full = proc.full_fine_tune
    trained = tuple(p.name for p in parts if full and (
        (tr.train_unet and p.role == PartRole.DENOISER.value) or
        (tr.train_text_encoder and p.role == PartRole.TEXT_ENCODER.value)))
    resolution, frames = resolutions(proc)
    caps = desc.capabilities
    try:
        tokens = getattr(desc.parse_model_kwargs(m.model_kwargs), "max_sequence_length",
                         None)
    except ModelKwargsError:  # the preflight's own check says where, once
        tokens = None
    return Plan(
        device=device, parts=tuple(parts), optimizer=tr.optimizer, batch=tr.batch_size,
        rank=proc.network.dim if proc.network is not None else 0,
        trained=trained, full_fine_tune=full, ema=tr.ema_config.use_ema,
        resolution=resolution, frames=frames,
        size_multiple=desc.size_multiple or 16,
        quantizes_while_loading=desc.quantizes_while_loading,
        frame_step=caps.video.step if caps and caps.video else 4,
        gradient_checkpointing=tr.gradient_checkpointing, train_dtype=train_dtype,
        text_tokens=tokens or 512, device_free_bytes=device_free, host_free_bytes=host_free)


# ---- the machine -------------------------------------------------------------------------
def host_available() -> int | None:
    """The host memory a new process can use (Linux MemAvailable; else free pages)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _has_nvidia() -> bool:
    return Path("/proc/driver/nvidia").exists() or Path("/dev/nvidia0").exists()


def resolve_device(requested: str | None) -> str:
    """The device a run would train on: the config's, else cuda when there is one. torch
    is imported only where an NVIDIA driver is present."""
    if requested:
        return requested
    if not _has_nvidia():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_available(device: str) -> int | None:
    """Free memory of `device` now (cuda: the driver's free bytes; cpu: the host's)."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return host_available()
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(int(index or 0))
        return int(free)
    return None  # mps: shared memory, no free figure the forecast could trust


def memory_forecast(proc: object) -> Forecast | None:
    """The forecast of one process on this machine; None for a file job's process
    (extract, mod, merge, generate: no training), an arch without sizes (an extension)
    or a tiny model still to be built (`create_if_missing`)."""
    from aitk.models import catalog

    if not isinstance(proc, TrainingProcess):
        return None

    if proc.model.arch not in catalog.builtin_archs():
        return None
    if proc.model.create_if_missing and not Path(proc.model.name_or_path).expanduser() \
            .exists():
        return None
    device = resolve_device(proc.device)
    host = host_available()
    plan = plan_of(proc, catalog.description(proc.model.arch), device.split(":")[0],
                   device_available(device), host)
    return None if plan is None else forecast(plan)


def gib(n: float) -> str:
    return f"{n / 1024 ** 3:.1f} GiB"


def describe(f: Forecast) -> Iterable[str]:
    """The forecast in words, for a finding."""
    where = "host" if f.device == "cpu" else f.device
    yield f"peak {gib(f.device_peak_bytes)} on the {where}"
    if f.device_free_bytes is not None:
        yield f"{gib(f.device_free_bytes)} free"
