"""Peak device memory and peak host RSS of a training run (a LoRA, a full fine-tune, a
slider), forecast before anything loads: pure functions over plain data (no torch, no
weights), so `run.py --check`, the preflight and the web UI can answer "will this fit?"
in milliseconds.

`forecast(plan)` returns the two peaks, whether they fit the free memory it was given,
and `hints`: the cheapest single changes of the job (each a config edit) that make a
run that does not fit, fit. aitk.memory.plan builds the `Plan` from a job config and
the arch's description (aitk/models/<arch>/arch.py part sizes).

What the numbers are: the device peak is what the allocator holds at the worst moment
(`torch.cuda.max_memory_allocated`) plus the CUDA context; the host peak is the whole
process's peak resident set as the OS counts it (`ru_maxrss`), interpreter, torch and
libraries included. On a CPU run the device is the host and both are the RSS.

A run has two phases, and the peak is the larger:
- loading and caching: every part is read in float before anything is quantized (the
  loaders read a part whole, then aitk.models.quantize converts it layer by layer), the
  text encoders and the VAE run to cache embeddings and latents;
- training: the resting weights, what trains (the adapter, or a full fine-tune's own
  weights) with its gradient, optimizer state and EMA copy, the activations of one
  step; text encoders whose embeddings are cached are gone.

A full fine-tune (`Plan.full_fine_tune`, aitk.run.finetune) trains the parts named in
`Plan.trained` in the dtype they were loaded in: their gradients are that size again,
the optimizer's state is its bytes per weight at that dtype, an EMA
(`train.ema_config.use_ema`) one more copy. `model.only_if_contains` /
`ignore_if_contains` are not counted (the whole part: an upper bound). A slider
(aitk.run.slider) forecasts as the LoRA training it is: its extra passes (the frozen
predictions for the prompts, the partial denoising that makes its latents) run without
gradients and keep no activations, and each polarity is backpropagated on its own, so
one step saves one pass's activations, as a LoRA step does.

Sources of the formulas:
- Bytes per weight (WEIGHT_BYTES): the storage of each format: float32 4, bf16/fp16 2,
  8-bit 1; sub-byte formats pack bits/8 plus one bf16 scale and one bf16 zero point
  per group of 128 weights (optimum-quanto's and torchao's default group size 128:
  4 / 128 bytes per weight).
- Optimizer state: each optimizer's bytes per trained weight are a fact of its spec
  (aitk.config.optimizers, `OptimizerSpec.state_per_weight`): torch's AdamW keeps
  `exp_avg` and `exp_avg_sq` in the weight's dtype (8 bytes for a float32 weight),
  bitsandbytes' AdamW8bit both moments in 8 bits (~2 bytes), Prodigy four copies. The
  adapter trains in float32 (aitk.adapters.network: parameter 4 + gradient 4 bytes).
- Adapter size: LoRA of rank r on a Linear(i, o) has r * (i + o) parameters. Without
  the layer shapes: the Flux/Qwen/Wan block layouts (double-stream ~36 d^2, single-
  stream ~15 d^2, Wan ~13 d^2 parameters for width d) average ~22 d^2, so
  d ~ sqrt(P / blocks / 22) for blocks of P parameters in all; their Linear layers then
  sum to i + o ~ 1.6 P / d (the meta-device builds of the real configs: Flux 5.37M
  and Qwen-Image 9.22M, against 6.2M and 8.3M from this rule).
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models" (arXiv:2205.05198), eq. 1: a transformer layer saves
  s*b*h*(34 + 5*a*s/h) bytes in 16-bit for s tokens, batch b, width h; with SDPA/flash
  attention the a*s/h term (the attention matrix) is not stored, leaving 34*s*b*h.
  With full checkpointing (their section 4.1) a layer keeps only its input (2*s*b*h),
  and one layer's full set exists during its recompute. Doubled for float32.
- Tokens: image tokens are (H / m) * (W / m) per latent frame, m the arch's size
  multiple (VAE factor x patch); a video of F frames has (F - 1) / step + 1 latent
  frames (Wan's causal VAE); text tokens TEXT_TOKENS (T5's and Qwen's 512 cap).
- Layer offloading (aitk.models.block_offload): the offloaded share of the block
  weights rests on the host, pinned; on the device at most two such blocks at once
  (running and prefetched). Autograd keeps the weights a block saved until its
  backward, so without gradient checkpointing offloading lowers no training peak.
- CUDA context and allocator slack (CUDA_CONTEXT_BYTES, ALLOCATOR_SLACK): the context
  of torch 2.x on recent GPUs is 0.3-0.6 GiB outside the allocator; the caching
  allocator reserves ~5-10% more than it hands out (fragmentation).
- Host baseline (HOST_BASE_BYTES, HOST_CUDA_BASE_BYTES) and the transient factor of
  loading (LOAD_FACTOR): measured with bench/memory_forecast.py (an idle trainer
  process after its imports: ~0.45 GiB on CPU; CUDA builds map ~1.5 GiB more), the
  constants are its calibration, not theory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from aitk.config.optimizers import OPTIMIZERS, canonical

GIB = 1024 ** 3

# Bytes per stored weight, by dtype or qtype name (scales included).
_GROUP_SCALES = 4 / 128  # a bf16 scale + a bf16 zero point per 128 weights
WEIGHT_BYTES: dict[str, float] = {
    "float32": 4.0, "fp32": 4.0, "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0,
    # optimum-quanto (per-channel scales for 8-bit: negligible per weight)
    "qfloat8": 1.0, "qfloat8_e4m3fn": 1.0, "qfloat8_e5m2": 1.0, "qint8": 1.0,
    "qint4": 0.5 + _GROUP_SCALES, "qint2": 0.25 + _GROUP_SCALES,
    # torchao
    "float8": 1.0, "int8": 1.0, "int4": 0.5 + _GROUP_SCALES,
    **{f"uint{bits}": bits / 8 + (_GROUP_SCALES if bits < 8 else 0.0)
       for bits in range(2, 9)},
}
ADAPTER_WEIGHT = "fp32"  # the adapter's parameters, gradients (and EMA) are float32
BLOCK_D2 = 22.0  # parameters per block / width^2 (see the module docstring)
ADAPTER_IO = 1.6  # sum(i + o) of a block set's Linear layers, per P / d
TEXT_TOKENS = 512
TEXT_LAYERS = 24  # a text encoder's layers when its description counts none (T5-XXL's)
CUDA_CONTEXT_BYTES = int(0.5 * GIB)
ALLOCATOR_SLACK = 1.08
HOST_BASE_BYTES = int(0.45 * GIB)
HOST_CUDA_BASE_BYTES = int(1.5 * GIB)  # more than HOST_BASE_BYTES: CUDA libraries mapped
# Loading reads a part in float while the model's other parts already sit in memory;
# the loaders keep small transient copies (state-dict pages, a layer being quantized).
LOAD_FACTOR = 1.05


def weight_bytes(kind: str) -> float:
    """Bytes per weight of a dtype or qtype name (`uint4|adapter` reads as uint4)."""
    name = kind.split("|", 1)[0].strip().lower()
    if name not in WEIGHT_BYTES:
        raise KeyError(f"no storage size known for {kind!r}")
    return WEIGHT_BYTES[name]


@dataclass(frozen=True)
class PartLoad:
    """One model part as the run holds it."""

    name: str  # the subfolder: "transformer", "text_encoder_2", "vae"
    role: str  # aitk.models.description.PartRole value
    params: int
    blocks: int = 0
    block_params: int = 0
    load_as: str = "bf16"  # what the loader reads it as (train dtype; float32 VAEs)
    stored_as: str = "bf16"  # after loading: the dtype, or the qtype of its Linear layers
    offload_share: float = 0.0  # `layer_offloading_*_percent` when offloading is on
    idle_on_host: bool = False  # `low_vram`: on the host except while it runs
    dropped_after_caching: bool = False  # a text encoder whose embeddings are cached
    file_bytes: float | None = None  # its safetensors files' bytes (None: as `load_as`)

    @property
    def float_bytes(self) -> float:
        """The part as the loader reads it, before quantizing."""
        return self.params * weight_bytes(self.load_as)

    @property
    def zero_copy(self) -> bool:
        """Whether the loaded tensors are the file's own mapped pages (same dtype): no
        second copy while loading, and the pages stay mapped while any tensor of the
        file lives (a quantized part's float pages stay with its float norms)."""
        return self.file_bytes is None or \
            abs(self.file_bytes - self.float_bytes) <= 0.02 * self.float_bytes

    @property
    def held_after_load(self) -> float:
        """Host bytes once loaded and quantized (before anything moves to a device)."""
        if not self.quantized_params:
            return self.float_bytes
        quantized = self.quantized_params * weight_bytes(self.stored_as)
        return self.float_bytes + quantized if self.zero_copy else self.resting_bytes

    @property
    def largest_block_float(self) -> float:
        """One block in float: what a quantized block dequantizes while it computes."""
        return self.block_params / self.blocks * weight_bytes(self.load_as) \
            if self.blocks else 0.0

    @property
    def quantized_params(self) -> int:
        """What quantization converts: the denoiser's blocks (its embedders and output
        layers stay float); a whole text encoder (its float embedding table is within
        the estimate)."""
        if self.stored_as == self.load_as:
            return 0
        return self.block_params if self.blocks else self.params

    @property
    def resting_bytes(self) -> float:
        q = self.quantized_params
        return q * weight_bytes(self.stored_as) + (self.params - q) * weight_bytes(self.load_as)

    @property
    def block_bytes(self) -> float:
        """All blocks' bytes as stored."""
        if not self.blocks:
            return 0.0
        kind = self.stored_as if self.quantized_params else self.load_as
        return self.block_params * weight_bytes(kind)

    @property
    def offloaded_blocks(self) -> int:
        return round(min(max(self.offload_share, 0.0), 1.0) * self.blocks)

    @property
    def offloaded_bytes(self) -> float:
        """What offloading keeps on the host. A part without counted blocks (a text
        encoder: its layers are not described) offloads the share of its weights."""
        if self.blocks:
            return self.block_bytes * self.offloaded_blocks / self.blocks
        return self.resting_bytes * min(max(self.offload_share, 0.0), 1.0)

    @property
    def visiting_bytes(self) -> float:
        """Offloaded bytes on the device at once: the running block and the prefetched
        one (a part without counted blocks: two of TEXT_LAYERS)."""
        if not self.offloaded_bytes:
            return 0.0
        unit = self.block_bytes / self.blocks if self.blocks else \
            self.resting_bytes / TEXT_LAYERS
        return min(2 * unit, self.offloaded_bytes)

    @property
    def width(self) -> float:
        """The estimated hidden width (see the module docstring)."""
        return math.sqrt(self.block_params / self.blocks / BLOCK_D2) if self.blocks else 0.0


@dataclass(frozen=True)
class Plan:
    """Everything the forecast reads about a run."""

    device: str  # "cpu", "cuda", "mps"
    parts: tuple[PartLoad, ...]
    rank: int = 16
    optimizer: str = "adamw"
    batch: int = 1
    resolution: int = 1024  # the largest bucket side
    frames: int = 1
    size_multiple: int = 16  # pixels per token side: VAE factor x patch
    frame_step: int = 4
    gradient_checkpointing: bool = True
    train_dtype: str = "bf16"
    text_tokens: int = TEXT_TOKENS
    device_free_bytes: int | None = None  # None: unknown (no comparison, no hints)
    host_free_bytes: int | None = None  # on a GPU run: the host's available memory
    # LoRA: the denoiser parts the adapter sits on (all: ()); a full fine-tune: the parts
    # whose own weights train (denoisers and, with train_text_encoder, text encoders)
    trained: tuple[str, ...] = ()
    full_fine_tune: bool = False
    ema: bool = False  # train.ema_config.use_ema: a copy of what trains
    quantizes_while_loading: bool = False  # the arch's loader: see `loading`

    @property
    def on_host(self) -> bool:
        return self.device == "cpu"


@dataclass(frozen=True)
class Forecast:
    device: str
    device_peak_bytes: int
    host_peak_bytes: int
    device_free_bytes: int | None
    host_free_bytes: int | None
    hints: tuple[str, ...] = ()
    parts: dict[str, int] = field(default_factory=dict)  # the terms of the peak, bytes

    @property
    def fits(self) -> bool | None:
        """Whether both peaks fit their free memory (None: the free memory is unknown)."""
        if self.device_free_bytes is None:
            return None
        ok = self.device_peak_bytes <= self.device_free_bytes
        if self.host_free_bytes is not None and self.device != "cpu":
            ok = ok and self.host_peak_bytes <= self.host_free_bytes
        return ok

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "device_peak_bytes": self.device_peak_bytes,
                "host_peak_bytes": self.host_peak_bytes,
                "device_free_bytes": self.device_free_bytes, "fits": self.fits,
                "hints": list(self.hints)}


# ---- the terms ---------------------------------------------------------------------------
def denoisers(plan: Plan) -> list[PartLoad]:
    return [p for p in plan.parts if p.role == "denoiser"]


def adapter_params(plan: Plan) -> int:
    """LoRA parameters: r * sum(i + o) over the trained blocks' Linear layers, with
    sum(i + o) ~ 1.6 P / d (module docstring)."""
    trained = [p for p in denoisers(plan) if not plan.trained or p.name in plan.trained]
    return int(sum(ADAPTER_IO * plan.rank * p.block_params / p.width
                    for p in trained if p.blocks))


def optimizer_state_per_weight(optimizer: str, weight: str) -> float:
    """Bytes of optimizer state per trained weight stored as `weight` (a dtype name);
    an optimizer not in the table counts as AdamW's."""
    spec = OPTIMIZERS.get(canonical(optimizer), OPTIMIZERS["adamw"])
    return spec.state_per_weight(weight_bytes(weight))


def trained_weights(plan: Plan) -> list[tuple[int, str]]:
    """(parameters, their dtype) of what trains: the adapter in float32, or a full
    fine-tune's trained parts as they were loaded."""
    if plan.full_fine_tune:
        return [(p.params, p.load_as) for p in plan.parts if p.name in plan.trained]
    return [(adapter_params(plan), ADAPTER_WEIGHT)]


def optimizer_bytes(plan: Plan) -> float:
    return sum(n * optimizer_state_per_weight(plan.optimizer, dtype)
               for n, dtype in trained_weights(plan))


def trained_bytes(plan: Plan) -> float:
    """Memory for training beyond the resting weights: the adapter's own weights (a full
    fine-tune's are the resting weights), the gradients, the optimizer's state and the
    EMA copy."""
    total = optimizer_bytes(plan)
    for n, dtype in trained_weights(plan):
        copies = 1 + (0 if plan.full_fine_tune else 1) + (1 if plan.ema else 0)
        total += n * weight_bytes(dtype) * copies
    return total


def tokens(plan: Plan) -> int:
    side = max(plan.resolution // plan.size_multiple, 1)
    latent_frames = (max(plan.frames, 1) - 1) // plan.frame_step + 1
    return side * side * latent_frames + plan.text_tokens


def activation_bytes(plan: Plan) -> float:
    """One training step's saved activations (Korthikanti et al. eq. 1 without the
    attention matrix; checkpointing keeps each block's input and one block whole)."""
    scale = weight_bytes(plan.train_dtype) / 2  # the paper counts 16-bit bytes
    total = 0.0
    for part in denoisers(plan):
        if not part.blocks:
            continue
        sbh = tokens(plan) * plan.batch * part.width
        per_block = 34 * sbh * scale
        if plan.gradient_checkpointing:
            total = max(total, 2 * sbh * scale * part.blocks + per_block)
        else:
            total = max(total, per_block * part.blocks)
    return total  # experts train by turns: the larger one's


def device_weights(plan: Plan, training: bool) -> float:
    """Weights on the device in a phase (caching: every part; training: cached text
    encoders gone). An idle part (`low_vram`) visits alone: the largest visitor counts;
    an idle expert waits while the other trains (experts are the same size)."""
    total, visitors = 0.0, [0.0]
    for part in plan.parts:
        if training and part.dropped_after_caching:
            continue
        if part.idle_on_host:
            if part.role != "denoiser":
                visitors.append(part.resting_bytes)
            continue
        if training and part.offloaded_bytes and not plan.gradient_checkpointing:
            total += part.resting_bytes  # autograd keeps every visited block's weights
        else:
            total += part.resting_bytes - part.offloaded_bytes + part.visiting_bytes
    return total + max(visitors)


def loading(plan: Plan) -> tuple[float, float]:
    """(the host's peak while loading, what the host holds after loading and
    quantizing). The parts load one after another, each read whole (its file pages
    mapped, plus a converted copy when the file's dtype is not the load dtype), then
    the quantized ones are converted layer by layer (aitk.models.quantize); a
    zero-copy part keeps its float pages mapped (its float norms and embedders hold
    the file). An arch that quantizes while loading (its description's
    `quantizes_while_loading`) reads each quantized part as stored plus one block in
    float; its unquantized parts load as above."""
    held = peak = 0.0
    streamed = plan.quantizes_while_loading
    for p in plan.parts:
        if streamed and p.quantized_params:  # as stored, plus one block in float
            peak = max(peak, held + p.resting_bytes + p.largest_block_float)
            held += p.resting_bytes
            continue
        file = p.float_bytes if p.file_bytes is None else p.file_bytes
        peak = max(peak, held + (file if p.zero_copy else file + p.float_bytes))
        held += p.float_bytes
    for p in plan.parts:
        if p.quantized_params and not streamed:
            peak = max(peak, held + p.quantized_params * weight_bytes(p.stored_as))
            held += p.held_after_load - p.float_bytes
    return LOAD_FACTOR * peak, held


def held_in_training(plan: Plan, held_after_load: float) -> float:
    """What the host holds while a CPU run trains: the loaded parts without the text
    encoders whose embeddings were cached, plus one quantized block in float."""
    gone = sum(p.held_after_load for p in plan.parts if p.dropped_after_caching)
    dequantized = max((p.largest_block_float for p in denoisers(plan)
                       if p.quantized_params), default=0.0)
    return held_after_load - gone + dequantized


def host_resting(plan: Plan, training: bool) -> float:
    """What a GPU run keeps on the host: offloaded blocks, idle (low_vram) parts."""
    total = 0.0
    for part in plan.parts:
        if training and part.dropped_after_caching:
            continue
        total += part.offloaded_bytes
        if part.idle_on_host:
            total += part.resting_bytes
    return total


def forecast(plan: Plan, with_hints: bool = True) -> Forecast:
    terms: dict[str, float] = {}
    load_peak, held = loading(plan)
    if plan.on_host:
        train = held_in_training(plan, held) + trained_bytes(plan) + activation_bytes(plan)
        terms = {"base": HOST_BASE_BYTES, "load": load_peak, "train": train}
        device_peak = host_peak = int(HOST_BASE_BYTES + max(load_peak, train))
    else:
        caching = device_weights(plan, training=False)
        training = device_weights(plan, True) + trained_bytes(plan) + activation_bytes(plan)
        terms = {"context": CUDA_CONTEXT_BYTES, "caching": caching, "train": training,
                 "trained": trained_bytes(plan), "activations": activation_bytes(plan),
                 "host_load": load_peak}
        device_peak = int(CUDA_CONTEXT_BYTES + ALLOCATOR_SLACK * max(caching, training))
        host_peak = int(HOST_CUDA_BASE_BYTES + max(load_peak, host_resting(plan, False)))
    result = Forecast(plan.device, device_peak, host_peak, plan.device_free_bytes,
                      plan.host_free_bytes, (), {k: int(v) for k, v in terms.items()})
    if with_hints and result.fits is False:
        result = replace(result, hints=tuple(hints(plan)))
    return result


# ---- what would make it fit --------------------------------------------------------------
QTYPE_LADDER = ("qfloat8", "uint4", "uint3")  # each smaller than the one before


def _changes(plan: Plan) -> Iterator[tuple[str, Plan]]:
    """Single changes of the job, cheapest first (by what they cost in quality and
    speed): caching embeddings and low_vram cost nothing trained, checkpointing costs
    speed, lower-bit weights cost some precision, offloading costs transfer time, a
    smaller batch or resolution changes what is trained."""
    live = [p for p in plan.parts if p.role == "text_encoder" and not p.dropped_after_caching]
    # a full fine-tune's trained weights cannot be cached away, quantized or offloaded
    # (the preflight refuses model.quantize there); its optimizer and EMA can shrink
    full = plan.full_fine_tune
    live = [p for p in live if not (full and p.name in plan.trained)]
    if live:
        yield ("train.cache_text_embeddings: true", replace(plan, parts=tuple(
            replace(p, dropped_after_caching=True) if p in live else p for p in plan.parts)))
    idle = [p for p in plan.parts if p.role != "denoiser" and not p.idle_on_host]
    if idle and not plan.on_host:
        yield ("model.low_vram: true", replace(plan, parts=tuple(
            replace(p, idle_on_host=True) if p in idle else p for p in plan.parts)))
    if not plan.gradient_checkpointing:
        yield "train.gradient_checkpointing: true", replace(plan, gradient_checkpointing=True)
    if full:
        small = "adamw8bit"
        if optimizer_state_per_weight(plan.optimizer, "fp32") > \
                optimizer_state_per_weight(small, "fp32"):
            yield f"train.optimizer: {small}", replace(plan, optimizer=small)
        if plan.ema:
            yield "train.ema_config.use_ema: false", replace(plan, ema=False)
    for part in denoisers(plan) if not full else ():
        now = weight_bytes(part.stored_as)
        for qtype in QTYPE_LADDER:
            if weight_bytes(qtype) < now:
                note = " + an accuracy recovery adapter" if qtype in ("uint4", "uint3") else ""
                yield (f"model.quantize: true, qtype: {qtype}{note}",
                       _with_denoisers(plan, stored_as=qtype))
    if any(p.blocks for p in denoisers(plan)) and not plan.on_host and not full:
        for tenth in range(1, 11):
            share = tenth / 10
            if all(p.offload_share < share for p in denoisers(plan)):
                yield (f"model.layer_offloading: true, layer_offloading_transformer_"
                       f"percent: {share:g}", _with_denoisers(plan, offload_share=share))
    if plan.batch > 1:
        yield "train.batch_size: 1", replace(plan, batch=1)
    for side in (1024, 768, 512):
        if side < plan.resolution:
            yield f"resolution {side}", replace(plan, resolution=side)


def _with_denoisers(plan: Plan, **change: Any) -> Plan:
    return replace(plan, parts=tuple(replace(p, **change) if p.role == "denoiser" else p
                                     for p in plan.parts))


def hints(plan: Plan, most: int = 3) -> list[str]:
    """Up to `most` changes that each make the run fit, cheapest first; for offloading
    and resolution only the least change that fits. When no single change is enough,
    the cheapest pair."""
    found: list[str] = []
    kinds: set[str] = set()
    singles = list(_changes(plan))
    for text, changed in singles:
        kind = text.split(":")[0].split(" ")[0]
        if kind in kinds:
            continue
        if forecast(changed, with_hints=False).fits:
            found.append(text)
            kinds.add(kind)
        if len(found) == most:
            return found
    if found:
        return found
    for i, (first, changed) in enumerate(singles):
        for second, _ in singles[i + 1:]:
            both = dict(_changes(changed)).get(second)
            if both is not None and forecast(both, with_hints=False).fits:
                return [f"{first} and {second}"]
    return []
