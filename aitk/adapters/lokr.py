"""LoKr through peft: `LoKrConfig` on the same targets as LoRA (new LoKr format only)."""

from __future__ import annotations

from peft import LoKrConfig


def lokr_config(target_modules: list[str], rank: int, alpha: float, dropout: float,
                factor: int = -1) -> LoKrConfig:
    # init_weights=True zeroes one factor, so a fresh adapter changes nothing.
    return LoKrConfig(r=rank, alpha=alpha, module_dropout=dropout,
                      decompose_factor=factor, target_modules=target_modules,
                      init_weights=True)
