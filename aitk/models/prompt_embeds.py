"""AdvancedPromptEmbeds: per-item text conditioning.

Rules (the trainer and the text-embed cache depend on them):

- Every key holds a list with one tensor per batch item (`text_embeds=[t0, t1, ...]`).
- Each per-item tensor is 2-D `(L, D)` at the item's natural length. Anything else is
  rejected at construction: a 3-D item would be read as an already-batched `(B, L, D)`
  and silently break batch-size inference. Flatten extra axes into D (`(L, N*D)`) in
  `get_prompt_embeds` and restore them right before the model call.
- Padding to the batch maximum happens only at the model call: `pad(key)` returns the
  padded `(B, Lmax, D)` tensor and a boolean `(B, Lmax)` mask (True = real token).
- Keys named in `frozen_dtype_keys` (token ids, masks) keep their dtype on `.to(dtype=)`.
- `cat([...])` builds a batch from per-item (e.g. cached) entries; `concat(other)` is the
  CFG concat; `select(indices)` picks items; `expand_to_batch(n)` repeats a single item.
- `save(path)` / `load(path)` use safetensors (written atomically) for the disk cache;
  a damaged file raises `PromptEmbedsFileError` so the caller recomputes the entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from aitk.errors import PromptEmbedsError, PromptEmbedsFileError

FORMAT_NAME = "aitk-prompt-embeds"
FORMAT_VERSION = "1"


class AdvancedPromptEmbeds:
    """A dict of key -> list of per-item 2-D tensors (see the module docstring)."""

    def __init__(self, *, frozen_dtype_keys: Iterable[str] = (),
                 **embeds: Sequence[torch.Tensor]) -> None:
        if not embeds:
            raise PromptEmbedsError("AdvancedPromptEmbeds needs at least one key")
        items: dict[str, list[torch.Tensor]] = {}
        count: int | None = None
        for key, value in embeds.items():
            if isinstance(value, torch.Tensor):
                raise PromptEmbedsError(
                    f"embeds key {key!r} must be a list of per-item 2-D (L, D) tensors, "
                    f"got one tensor of shape {tuple(value.shape)}")
            values = list(value)
            for i, t in enumerate(values):
                if not isinstance(t, torch.Tensor) or t.dim() != 2:
                    shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                    raise PromptEmbedsError(
                        f"embeds key {key!r} item {i} must be a 2-D (L, D) tensor, got "
                        f"{shape}; flatten extra axes into D ((L, N*D)) and restore them "
                        f"at the model call")
            if count is not None and len(values) != count:
                raise PromptEmbedsError(
                    f"embeds key {key!r} has {len(values)} items, other keys have {count}")
            count = len(values)
            items[key] = values
        frozen = tuple(frozen_dtype_keys)
        unknown = [k for k in frozen if k not in items]
        if unknown:
            raise PromptEmbedsError(f"frozen_dtype_keys names unknown keys: {unknown}")
        self._items = items
        self.frozen_dtype_keys: tuple[str, ...] = frozen

    # ---- access ----------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._items)

    def __getitem__(self, key: str) -> list[torch.Tensor]:
        return self._items[key]

    def __getattr__(self, key: str) -> list[torch.Tensor]:
        # `embeds.text_embeds` reads like upstream; only called for missing attributes.
        items = self.__dict__.get("_items")
        if items is not None and key in items:
            return items[key]
        raise AttributeError(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(next(iter(self._items.values())))

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    @property
    def batch_size(self) -> int:
        return len(self)

    def __repr__(self) -> str:
        shapes = {k: [tuple(t.shape) for t in v] for k, v in self._items.items()}
        return f"AdvancedPromptEmbeds({shapes}, frozen_dtype_keys={self.frozen_dtype_keys})"

    def _new(self, items: dict[str, list[torch.Tensor]]) -> AdvancedPromptEmbeds:
        return AdvancedPromptEmbeds(frozen_dtype_keys=self.frozen_dtype_keys, **items)

    # ---- transforms --------------------------------------------------------------------
    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> AdvancedPromptEmbeds:
        """Move every key; cast only the keys not in `frozen_dtype_keys`."""
        out = {}
        for key, values in self._items.items():
            cast = None if key in self.frozen_dtype_keys else dtype
            out[key] = [t.to(device=device, dtype=cast) for t in values]
        return self._new(out)

    def detach(self) -> AdvancedPromptEmbeds:
        return self._new({k: [t.detach() for t in v] for k, v in self._items.items()})

    def clone(self) -> AdvancedPromptEmbeds:
        return self._new({k: [t.clone() for t in v] for k, v in self._items.items()})

    def select(self, indices: Iterable[int]) -> AdvancedPromptEmbeds:
        idx = list(indices)
        n = len(self)
        bad = [i for i in idx if not -n <= i < n]
        if bad:
            raise PromptEmbedsError(f"select: indices {bad} out of range for {n} items")
        return self._new({k: [v[i] for i in idx] for k, v in self._items.items()})

    def expand_to_batch(self, batch_size: int) -> AdvancedPromptEmbeds:
        """Repeat a single item `batch_size` times; a batch of that size is returned as is."""
        n = len(self)
        if n == batch_size:
            return self
        if n != 1:
            raise PromptEmbedsError(
                f"cannot expand {n} prompt embeds to a batch of {batch_size}")
        return self.select([0] * batch_size)

    @classmethod
    def cat(cls, parts: Sequence[AdvancedPromptEmbeds]) -> AdvancedPromptEmbeds:
        """Join batches item-wise (e.g. per-caption cache entries into one batch)."""
        if not parts:
            raise PromptEmbedsError("cat needs at least one AdvancedPromptEmbeds")
        first = parts[0]
        for p in parts[1:]:
            if p.keys() != first.keys():
                raise PromptEmbedsError(f"cat: keys differ: {first.keys()} vs {p.keys()}")
            if set(p.frozen_dtype_keys) != set(first.frozen_dtype_keys):
                raise PromptEmbedsError("cat: frozen_dtype_keys differ")
        items = {k: [t for p in parts for t in p[k]] for k in first.keys()}
        return first._new(items)

    def concat(self, other: AdvancedPromptEmbeds) -> AdvancedPromptEmbeds:
        """CFG concat: `uncond.concat(cond)` is the batch [uncond..., cond...]."""
        return AdvancedPromptEmbeds.cat([self, other])

    # ---- the model call ----------------------------------------------------------------
    def pad(self, key: str, *, padding_side: str = "right", pad_value: float = 0.0,
            max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad `key` to (B, Lmax, D); the mask (B, Lmax) is True on real tokens."""
        if key not in self._items:
            raise PromptEmbedsError(f"no embeds key {key!r}; keys: {self.keys()}")
        if padding_side not in ("right", "left"):
            raise PromptEmbedsError(f"padding_side must be 'right' or 'left', "
                                    f"got {padding_side!r}")
        values = self._items[key]
        dims = {t.shape[1] for t in values}
        if len(dims) != 1:
            raise PromptEmbedsError(f"embeds key {key!r} items have different widths {dims}")
        longest = max(t.shape[0] for t in values)
        lmax = longest if max_length is None else max(max_length, longest)
        first = values[0]
        padded = first.new_full((len(values), lmax, first.shape[1]), pad_value)
        mask = torch.zeros(len(values), lmax, dtype=torch.bool, device=first.device)
        for i, t in enumerate(values):
            n = t.shape[0]
            sl = slice(0, n) if padding_side == "right" else slice(lmax - n, lmax)
            padded[i, sl] = t.to(padded.dtype)
            mask[i, sl] = True
        return padded, mask

    # ---- disk cache --------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write to `path` (safetensors) atomically."""
        from safetensors.torch import save

        from aitk_common.files import atomic_write_bytes

        tensors = {f"{key}.{i}": t.detach().to("cpu").contiguous().clone()
                   for key, values in self._items.items() for i, t in enumerate(values)}
        metadata = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "keys": json.dumps(self.keys()),
            "frozen_dtype_keys": json.dumps(list(self.frozen_dtype_keys)),
            "count": str(len(self)),
        }
        atomic_write_bytes(Path(path), save(tensors, metadata=metadata))

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu"
             ) -> AdvancedPromptEmbeds:
        """Read a file written by `save`; raises PromptEmbedsFileError when damaged."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", device=str(device)) as fh:
                meta = fh.metadata() or {}
                if meta.get("format") != FORMAT_NAME:
                    raise PromptEmbedsFileError(f"{path}: not a prompt-embeds file")
                if meta.get("format_version") != FORMAT_VERSION:
                    raise PromptEmbedsFileError(
                        f"{path}: format version {meta.get('format_version')!r}, "
                        f"expected {FORMAT_VERSION}")
                keys = json.loads(meta["keys"])
                frozen = json.loads(meta["frozen_dtype_keys"])
                count = int(meta["count"])
                items = {k: [fh.get_tensor(f"{k}.{i}") for i in range(count)] for k in keys}
        except PromptEmbedsFileError:
            raise
        except Exception as exc:  # safetensors raises several types for a torn file
            raise PromptEmbedsFileError(f"{path}: unreadable prompt-embeds file: {exc}") from exc
        return cls(frozen_dtype_keys=frozen, **items)
