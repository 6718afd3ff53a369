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

`cfg` is duck-typed: `type` ("lora" | "lokr" | "dora"), `linear` (rank), `linear_alpha`,
`dropout`, `network_kwargs` (`only_if_contains: [...]`, `ignore_if_contains: [...]`:
substrings of module paths), optional `lokr_factor`, `conv` and `conv_alpha`.

LoCon (`conv`, upstream's and kohya's meaning): on archs with convolutional blocks
(the model's `lora_conv_prefixes`, the UNet's ResNet and resampling blocks) the Conv2d
layers get LoRA too, the 3x3 ones at rank `conv` and alpha `conv_alpha` (default
`conv`), the 1x1 ones at the linear rank and alpha (kohya's rule). An arch without
such blocks has nothing for it, as upstream: its web UI writes `conv` into every job.
DoRA (`type: dora`) is peft's LoRA with `use_dora`: a learned magnitude per output
row of each adapted layer, saved as `<module>.dora_scale` (LyCORIS's name and
output-axis shape, which ComfyUI reads). For LoRA `dropout` is peft's
`lora_dropout` on the adapter input; peft's LoKr has no input dropout, so there it is
`module_dropout` (the whole adapter of a layer skipped with that probability).

Targets are the nn.Linear layers (quantized ones included) under the model's
`lora_block_prefixes`, filtered by those patterns. With `train_text_encoder` (the
job's `train.train_text_encoder`) the same kind of adapter also goes on the Linear
layers under `text_encoder_lora_prefixes` of each part the model's
`text_encoder_parts()` names (same rank, alpha and filters), and the model is told
(`train_text_encoders()`). A fresh adapter is the identity (LoRA B and one LoKr factor
start at zero). Keys: see aitk.adapters.keys; a text encoder's internal names are its
part name + its peft names (`text_encoder.encoder.layers.0.mlp.fc1.lora_A.weight`); the
model's `convert_lora_weights_before_save/load` map internal <-> public names.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from peft import get_peft_model_state_dict, inject_adapter_in_model, set_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from aitk.adapters.keys import (
    ALPHA_SUFFIX,
    DORA_SUFFIX,
    MAGNITUDE_SUFFIX,
    module_of,
    split_alphas,
)
from aitk.errors import AdapterError

if TYPE_CHECKING:
    from aitk.models.base import BaseModel

ADAPTER_NAME = "default"
NETWORK_TYPES = ("lora", "lokr", "dora")


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


def select_conv_targets(module: nn.Module, prefixes: Iterable[str],
                        only_if_contains: Iterable[str] = (),
                        ignore_if_contains: Iterable[str] = ()) -> list[str]:
    """Full paths of the Conv2d layers under `prefixes` (LoCon), filtered likewise."""
    only, ignore, roots = list(only_if_contains), list(ignore_if_contains), tuple(prefixes)
    if not roots:
        return []
    return [name for name, child in module.named_modules()
            if isinstance(child, nn.Conv2d) and name.startswith(roots)
            and (not only or any(p in name for p in only))
            and not any(p in name for p in ignore)]


def conv_settings(module: nn.Module, convs: Iterable[str], rank: int, alpha: float
                  ) -> tuple[dict[str, int], dict[str, float]]:
    """Per-module rank and alpha of LoCon's 3x3 (and larger) convs; 1x1 ones keep the
    linear rank and alpha, as kohya's networks do."""
    ranks: dict[str, int] = {}
    alphas: dict[str, float] = {}
    for name in convs:
        if tuple(module.get_submodule(name).kernel_size) != (1, 1):
            ranks[name], alphas[name] = rank, alpha
    return ranks, alphas


def text_encoders_to_train(model: BaseModel, cfg: Any) -> dict[str, nn.Module]:
    """The text encoders the adapter also trains: none unless `cfg.train_text_encoder`,
    then every part the model names (an arch that names none refuses)."""
    if not getattr(cfg, "train_text_encoder", False):
        return {}
    from aitk.models import catalog

    parts = model.text_encoder_parts()
    # A built-in arch's LoRA layout says whether it has text-encoder keys: a model may
    # name text encoders it can fully fine-tune yet write no text-encoder LoRA (example).
    described = model.arch not in catalog.builtin_archs() or \
        catalog.trains_text_encoders(model.arch)
    if not parts or not described:
        raise AdapterError(f"train.train_text_encoder: arch {model.arch!r} trains its "
                           "denoiser only (no text-encoder LoRA); remove the setting")
    return parts


def _adapter_config(network_type: str, targets: list[str], rank: int, alpha: float,
                    dropout: float, cfg: Any, model: BaseModel,
                    ranks: Mapping[str, int] | None = None,
                    alphas: Mapping[str, float] | None = None) -> Any:
    """peft's config for one part's targets (`ranks`/`alphas`: LoCon's convs)."""
    if network_type in ("lora", "dora"):
        from aitk.adapters.lora import lora_config

        # peft reads the pattern keys as regexes, matched against whole module names.
        return lora_config(
            targets, rank, alpha, dropout,
            rank_pattern={f"^{re.escape(n)}$": r for n, r in (ranks or {}).items()},
            alpha_pattern={f"^{re.escape(n)}$": a for n, a in (alphas or {}).items()},
            use_dora=network_type == "dora")
    if model.use_old_lokr_format:
        raise AdapterError(f"arch {model.arch!r} uses the old LoKr format, which "
                           f"this trainer does not write")
    from aitk.adapters.lokr import lokr_config

    return lokr_config(targets, rank, alpha, dropout,
                       int(getattr(cfg, "lokr_factor", -1) or -1))


class AdapterNetwork:
    def __init__(self, module: nn.Module, network_type: str, rank: int, alpha: float,
                 target_modules: list[str], arch: str,
                 text_encoders: dict[str, nn.Module] | None = None,
                 alphas: Mapping[str, float] | None = None) -> None:
        self.module = module
        # Part name -> text encoder with its own adapter; their internal keys carry the
        # part name as a prefix.
        self.text_encoders = dict(text_encoders or {})
        self.type = network_type
        self.rank = rank
        self.alpha = alpha
        self.alphas = dict(alphas or {})  # per module where it differs (LoCon's convs)
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
        encoders = text_encoders_to_train(model, cfg)
        if any(isinstance(m, BaseTunerLayer) for part in (module, *encoders.values())
               for m in part.modules()):
            raise AdapterError("this model already has an adapter attached; load a fresh "
                               "model for another network")
        only = kwargs.get("only_if_contains") or ()
        ignore = kwargs.get("ignore_if_contains") or ()
        targets = select_targets(module, model.lora_block_prefixes, only, ignore)
        if not targets:
            raise AdapterError(
                f"no Linear layers under {list(model.lora_block_prefixes)} match "
                f"network_kwargs {kwargs}; check only_if_contains / ignore_if_contains")
        clash = [t for t in targets if t.split(".", 1)[0] in encoders]
        if clash:  # a denoiser path that reads as a text encoder's internal key
            raise AdapterError(f"{model.arch}: denoiser layer {clash[0]!r} starts with a "
                               "text encoder's part name")
        if network_type == "dora" and not model.supports_dora:
            raise AdapterError(f"network.type dora: arch {model.arch!r}'s LoRA files "
                               "have no place for DoRA's per-layer magnitude (dora_scale) "
                               "yet; use lora or lokr")
        ranks: dict[str, int] = {}
        alphas: dict[str, float] = {}
        conv = int(getattr(cfg, "conv", None) or 0)
        if conv and network_type in ("lora", "dora"):  # LoCon: the denoiser's convs
            convs = select_conv_targets(module, model.lora_conv_prefixes, only, ignore)
            ranks, alphas = conv_settings(module, convs, conv,
                                          float(getattr(cfg, "conv_alpha", None) or conv))
            targets = targets + [n for n in convs if n not in targets]
        parts: list[tuple[nn.Module, list[str], dict[str, int], dict[str, float]]] = [
            (module, targets, ranks, alphas)]
        for name, encoder in encoders.items():
            found = select_targets(encoder, model.text_encoder_lora_prefixes, only, ignore)
            if not found:
                raise AdapterError(
                    f"no Linear layers of {name} under "
                    f"{list(model.text_encoder_lora_prefixes)} match network_kwargs "
                    f"{kwargs}; check only_if_contains / ignore_if_contains, or turn off "
                    "train.train_text_encoder")
            parts.append((encoder, found, {}, {}))
        for part, found, part_ranks, part_alphas in parts:
            config = _adapter_config(network_type, found, rank, alpha, dropout, cfg, model,
                                     part_ranks, part_alphas)
            inject_adapter_in_model(config, part, adapter_name=ADAPTER_NAME)
        net = cls(module, network_type, rank, alpha, targets, model.arch, encoders, alphas)
        net._model = model
        for p in net.trainable_parameters():
            p.data = p.data.to(dtype)
        if encoders:
            model.train_text_encoders()
        return net

    # ---- parameters ------------------------------------------------------------------
    def trained_parts(self) -> list[nn.Module]:
        """The modules that carry this adapter: the denoiser, then any text encoders."""
        return [self.module, *self.text_encoders.values()]

    def _layers(self, parts: Iterable[nn.Module] | None = None) -> list[BaseTunerLayer]:
        return [m for part in (self.trained_parts() if parts is None else parts)
                for m in part.modules() if isinstance(m, BaseTunerLayer)]

    def trainable_parameters(self, parts: Iterable[nn.Module] | None = None
                             ) -> list[nn.Parameter]:
        return [p for layer in self._layers(parts) for name, p in layer.named_parameters()
                if ADAPTER_NAME in name.split(".") and "base_layer" not in name]

    def text_encoder_parameters(self) -> list[nn.Parameter]:
        """The text encoders' adapter weights (their own learning rate)."""
        return self.trainable_parameters(self.text_encoders.values())

    def _peft_state(self) -> dict[str, torch.Tensor]:
        """peft's state dicts of every part, a text encoder's keys under its name."""
        sd = dict(get_peft_model_state_dict(self.module, adapter_name=ADAPTER_NAME))
        for name, encoder in self.text_encoders.items():
            sd.update({f"{name}.{k}": v for k, v in
                       get_peft_model_state_dict(encoder, adapter_name=ADAPTER_NAME).items()})
        return sd

    def _set_peft_state(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        own: dict[str, torch.Tensor] = {}
        encoders: dict[str, dict[str, torch.Tensor]] = {n: {} for n in self.text_encoders}
        for key, value in state_dict.items():
            part, _, rest = key.partition(".")
            if part in encoders:
                encoders[part][rest] = value
            else:
                own[key] = value
        set_peft_model_state_dict(self.module, own, adapter_name=ADAPTER_NAME)
        for name, encoder in self.text_encoders.items():
            set_peft_model_state_dict(encoder, encoders[name], adapter_name=ADAPTER_NAME)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Adapter weights in internal names (detached copies), for checkpoints."""
        return {k: v.detach().clone() for k, v in self._peft_state().items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load internal-name weights; every adapter weight must be present, no extras."""
        expected = set(self._peft_state())
        given = set(state_dict)
        if given != expected:
            missing, extra = sorted(expected - given), sorted(given - expected)
            raise AdapterError(
                f"adapter weights do not fit this network ({self.type}, rank {self.rank}): "
                f"{len(missing)} missing (e.g. {missing[:3]}), "
                f"{len(extra)} unexpected (e.g. {extra[:3]})")
        current = self._peft_state()
        bad = [k for k in expected if tuple(current[k].shape) != tuple(state_dict[k].shape)]
        if bad:
            raise AdapterError(f"adapter weight shapes differ (e.g. {bad[0]}: file "
                               f"{tuple(state_dict[bad[0]].shape)}, network "
                               f"{tuple(current[bad[0]].shape)})")
        dtypes = {k: v.dtype for k, v in current.items()}
        cast = {k: v.to(dtypes[k]) for k, v in state_dict.items()}
        self._set_peft_state(cast)

    # ---- files -----------------------------------------------------------------------
    def save_file(self, path: str | Path, metadata: Mapping[str, str] | None = None,
                  dtype: torch.dtype | None = None) -> None:
        """Write the public-name file (with per-module alpha) and metadata atomically,
        then tell the model (`on_lora_file_saved`: an arch may add another layout)."""
        from safetensors.torch import save

        from aitk_common.files import atomic_write_bytes

        sd = {k: (v if dtype is None else v.to(dtype)).contiguous()
              for k, v in self.state_dict().items()}
        sd = self._magnitudes_to_dora_scales(sd)
        for mod in sorted({module_of(k) for k in sd if not k.endswith(DORA_SUFFIX)}):
            sd[mod + ALPHA_SUFFIX] = torch.tensor(self.alphas.get(mod, self.alpha),
                                                  dtype=torch.float32)
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
        weights = self._dora_scales_to_magnitudes(weights)
        for mod, file_alpha in alphas.items():
            mine = self.alphas.get(mod, self.alpha)
            if file_alpha != mine:
                self._rescale(weights, mod, file_alpha / mine)
        self.load_state_dict(weights)
        return metadata

    def _submodule(self, name: str) -> nn.Module:
        """An internal module name (a text encoder's carries its part name) -> module."""
        part, _, rest = name.partition(".")
        if part in self.text_encoders:
            return self.text_encoders[part].get_submodule(rest)
        return self.module.get_submodule(name)

    def _magnitudes_to_dora_scales(self, sd: dict[str, torch.Tensor]
                                   ) -> dict[str, torch.Tensor]:
        """peft's `lora_magnitude_vector` -> the files' `dora_scale`, one value per output
        row: (out, 1) for a Linear, (out, 1, 1, 1) for a Conv2d."""
        out = {}
        for key, value in sd.items():
            if key.endswith(MAGNITUDE_SUFFIX):
                mod = key[: -len(MAGNITUDE_SUFFIX)]
                base = self._submodule(mod).get_base_layer().weight
                key = mod + DORA_SUFFIX
                value = value.reshape(base.shape[0], *[1] * (base.dim() - 1))
            out[key] = value
        return out

    def _dora_scales_to_magnitudes(self, weights: dict[str, torch.Tensor]
                                   ) -> dict[str, torch.Tensor]:
        if not any(k.endswith(DORA_SUFFIX) for k in weights):
            return weights
        shapes = {k: v.shape for k, v in self._peft_state().items()}
        out = {}
        for key, value in weights.items():
            if key.endswith(DORA_SUFFIX):
                key = key[: -len(DORA_SUFFIX)] + MAGNITUDE_SUFFIX
                if key in shapes:  # a file that does not fit is refused by load_state_dict
                    value = value.reshape(shapes[key])
            out[key] = value
        return out

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
