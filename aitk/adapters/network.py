"""AdapterNetwork: the one adapter object the trainer holds (LoRA or LoKr, via peft).

    net = AdapterNetwork.attach(model, cfg)   # cfg: the job's `network:` section
    optimizer = AdamW(net.trainable_parameters(), ...)
    ckpt = net.state_dict()                   # internal names, for checkpoints
    net.load_state_dict(ckpt)                 # exact inverse
    net.save_file(path, metadata)             # public names + metadata, atomic write
                                              # (one file per model.lora_file_suffixes())
    net.load_file(path)                       # public names back (returns the metadata)
    net.set_multiplier(0.5); net.disable(); net.enable()
    with net.disabled(): ...                  # the base model alone

`cfg` is duck-typed: `type` ("lora" | "lokr"), `linear` (rank), `linear_alpha`,
`dropout`, `network_kwargs` (`only_if_contains: [...]`, `ignore_if_contains: [...]`:
substrings of module paths), optional `lokr_factor`. For LoRA `dropout` is peft's
`lora_dropout` on the adapter input; peft's LoKr has no input dropout, so there it is
`module_dropout` (the whole adapter of a layer skipped with that probability).

Targets are the nn.Linear layers (quantized ones included) under the model's
`lora_block_prefixes`, filtered by those patterns. A fresh adapter is the identity
(LoRA B and one LoKr factor start at zero). Keys: see aitk.adapters.keys; the model's
`convert_lora_weights_before_save/load` map internal <-> public names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from peft import get_peft_model_state_dict, inject_adapter_in_model, set_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from aitk.adapters.keys import ALPHA_SUFFIX, module_of, split_alphas
from aitk.errors import AdapterError

if TYPE_CHECKING:
    from aitk.models.base import BaseModel

ADAPTER_NAME = "default"
NETWORK_TYPES = ("lora", "lokr")


def part_path(path: Path, suffix: str) -> Path:
    """`out/NAME.safetensors` + `_high_noise` -> `out/NAME_high_noise.safetensors`."""
    return path if not suffix else path.with_name(path.stem + suffix + path.suffix)


def _read_adapter_file(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            return dict(fh.metadata() or {}), {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # safetensors raises several types for a torn file
        raise AdapterError(f"{path}: unreadable adapter file: {exc}") from exc


def select_targets(module: nn.Module, prefixes: Iterable[str],
                   only_if_contains: Iterable[str] = (),
                   ignore_if_contains: Iterable[str] = ()) -> list[str]:
    """Full paths of the Linear layers under `prefixes`, filtered by substring patterns."""
    only, ignore, roots = list(only_if_contains), list(ignore_if_contains), tuple(prefixes)
    names = []
    for name, child in module.named_modules():
        if not isinstance(child, nn.Linear) or not name.startswith(roots):
            continue
        if only and not any(p in name for p in only):
            continue
        if any(p in name for p in ignore):
            continue
        names.append(name)
    return names


class AdapterNetwork:
    def __init__(self, module: nn.Module, network_type: str, rank: int, alpha: float,
                 target_modules: list[str], arch: str) -> None:
        self.module = module
        self.type = network_type
        self.rank = rank
        self.alpha = alpha
        self.target_modules = target_modules
        self.arch = arch
        self._model: BaseModel | None = None
        self.multiplier = 1.0
        self.enabled = True

    @classmethod
    def attach(cls, model: BaseModel, cfg: Any, dtype: torch.dtype = torch.float32
               ) -> AdapterNetwork:
        """Inject a fresh adapter into `model.get_model_to_train()`.

        Trainable parameters are kept in `dtype` (float32 by default, also when the base
        runs in bf16: small updates to low-precision weights would round away).
        """
        network_type = str(getattr(cfg, "type", "lora")).lower()
        if network_type not in NETWORK_TYPES:
            raise AdapterError(f"network.type {network_type!r} is not supported; "
                               f"choose one of {', '.join(NETWORK_TYPES)}")
        rank = int(getattr(cfg, "linear", None) or 16)
        alpha = float(getattr(cfg, "linear_alpha", None) or rank)
        dropout = float(getattr(cfg, "dropout", None) or 0.0)
        kwargs = dict(getattr(cfg, "network_kwargs", None) or {})
        module = model.get_model_to_train()
        if any(isinstance(m, BaseTunerLayer) for m in module.modules()):
            raise AdapterError("this model already has an adapter attached; load a fresh "
                               "model for another network")
        targets = select_targets(module, model.lora_block_prefixes,
                                 kwargs.get("only_if_contains") or (),
                                 kwargs.get("ignore_if_contains") or ())
        if not targets:
            raise AdapterError(
                f"no Linear layers under {list(model.lora_block_prefixes)} match "
                f"network_kwargs {kwargs}; check only_if_contains / ignore_if_contains")
        if network_type == "lora":
            from aitk.adapters.lora import lora_config

            config = lora_config(targets, rank, alpha, dropout)
        else:
            if model.use_old_lokr_format:
                raise AdapterError(f"arch {model.arch!r} uses the old LoKr format, which "
                                   f"this trainer does not write")
            from aitk.adapters.lokr import lokr_config

            config = lokr_config(targets, rank, alpha, dropout,
                                 int(getattr(cfg, "lokr_factor", -1) or -1))
        inject_adapter_in_model(config, module, adapter_name=ADAPTER_NAME)
        net = cls(module, network_type, rank, alpha, targets, model.arch)
        net._model = model
        for p in net.trainable_parameters():
            p.data = p.data.to(dtype)
        return net

    # ---- parameters ------------------------------------------------------------------
    def _layers(self) -> list[BaseTunerLayer]:
        return [m for m in self.module.modules() if isinstance(m, BaseTunerLayer)]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self._layers() for name, p in layer.named_parameters()
                if ADAPTER_NAME in name.split(".") and "base_layer" not in name]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapter weights in internal names (detached copies), for checkpoints."""
        sd = get_peft_model_state_dict(self.module, adapter_name=ADAPTER_NAME)
        return {k: v.detach().clone() for k, v in sd.items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load internal-name weights; every adapter weight must be present, no extras."""
        expected = set(get_peft_model_state_dict(self.module, adapter_name=ADAPTER_NAME))
        given = set(state_dict)
        if given != expected:
            missing, extra = sorted(expected - given), sorted(given - expected)
            raise AdapterError(
                f"adapter weights do not fit this network ({self.type}, rank {self.rank}): "
                f"{len(missing)} missing (e.g. {missing[:3]}), "
                f"{len(extra)} unexpected (e.g. {extra[:3]})")
        current = get_peft_model_state_dict(self.module, adapter_name=ADAPTER_NAME)
        bad = [k for k in expected if tuple(current[k].shape) != tuple(state_dict[k].shape)]
        if bad:
            raise AdapterError(f"adapter weight shapes differ (e.g. {bad[0]}: file "
                               f"{tuple(state_dict[bad[0]].shape)}, network "
                               f"{tuple(current[bad[0]].shape)})")
        dtypes = {k: v.dtype for k, v in current.items()}
        cast = {k: v.to(dtypes[k]) for k, v in state_dict.items()}
        set_peft_model_state_dict(self.module, cast, adapter_name=ADAPTER_NAME)

    # ---- files -----------------------------------------------------------------------
    def save_file(self, path: str | Path, metadata: Mapping[str, str] | None = None,
                  dtype: torch.dtype | None = None) -> None:
        """Write the public-name file (with per-module alpha) and metadata atomically,
        then tell the model (`on_lora_file_saved`: an arch may add another layout)."""
        from safetensors.torch import save

        from aitk_common.files import atomic_write_bytes

        sd = {k: (v if dtype is None else v.to(dtype)).contiguous()
              for k, v in self.state_dict().items()}
        for mod in sorted({module_of(k) for k in sd}):
            sd[mod + ALPHA_SUFFIX] = torch.tensor(self.alpha, dtype=torch.float32)
        model = self._require_model()
        public = model.convert_lora_weights_before_save(sd)
        meta = {"network_type": self.type, "network_rank": str(self.rank),
                "network_alpha": str(self.alpha), "base_model_arch": self.arch}
        meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
        # One file per part (the model's split: one by default, one per expert for
        # multi-expert models), each written atomically.
        for suffix, part in model.split_lora_file(public).items():
            atomic_write_bytes(part_path(Path(path), suffix), save(part, metadata=meta))
        model.on_lora_file_saved(Path(path), self)

    def file_paths(self, path: str | Path) -> list[Path]:
        """The files `save_file(path)` writes (`path` itself for one-file models)."""
        return [part_path(Path(path), s) for s in self._require_model().lora_file_suffixes()]

    def load_file(self, path: str | Path) -> dict[str, str]:
        """Load a public-name file; returns its metadata.

        A file whose alpha differs from this network's is rescaled so that the adapter's
        effect is the one it was saved with.
        """
        model = self._require_model()
        parts = {s: p for s, p in zip(model.lora_file_suffixes(), self.file_paths(path),
                                      strict=True) if p.exists()}
        if not parts or parts == {"": Path(path)}:
            metadata, public = _read_adapter_file(Path(path))
        else:  # per-expert files: join them
            read = {s: _read_adapter_file(p) for s, p in parts.items()}
            metadata = next(iter(read.values()))[0]
            public = model.join_lora_files({s: sd for s, (_, sd) in read.items()})
        internal = model.convert_lora_weights_before_load(public)
        weights, alphas = split_alphas(internal)
        for mod, file_alpha in alphas.items():
            if file_alpha != self.alpha:
                self._rescale(weights, mod, file_alpha / self.alpha)
        self.load_state_dict(weights)
        return metadata

    def _rescale(self, weights: dict[str, torch.Tensor], mod: str, factor: float) -> None:
        # delta = up @ down * alpha / rank (LoRA) or kron(w1, w2) * alpha / rank (LoKr):
        # scaling one factor by file_alpha / alpha keeps the saved delta.
        for suffix in (".lora_B.weight", ".lokr_w1", ".lokr_w1_a"):
            key = mod + suffix
            if key in weights:
                weights[key] = weights[key] * factor
                return

    def _require_model(self) -> BaseModel:
        if self._model is None:
            raise AdapterError("this network was not attached with AdapterNetwork.attach")
        return self._model

    # ---- runtime switches --------------------------------------------------------------
    def set_multiplier(self, scale: float) -> None:
        """Scale the adapter's effect (1.0 = as trained); applies to LoRA and LoKr."""
        for layer in self._layers():
            layer.set_scale(ADAPTER_NAME, float(scale))
        self.multiplier = float(scale)

    def enable(self) -> None:
        for layer in self._layers():
            layer.enable_adapters(True)
        self.enabled = True

    def disable(self) -> None:
        for layer in self._layers():
            layer.enable_adapters(False)
        self.enabled = False

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model alone inside the block (a preservation prior), the adapter as
        it was after it, even on error."""
        was = self.enabled
        self.disable()
        try:
            yield
        finally:
            if was:
                self.enable()
