"""LoRA through peft: `LoraConfig` injected on the model's layers: Linear layers, and
with `network.conv` the Conv2d layers of UNet archs (LoCon); `use_dora` for DoRA."""

from __future__ import annotations

from collections.abc import Mapping

from peft import LoraConfig


def lora_config(target_modules: list[str], rank: int, alpha: float, dropout: float,
                rank_pattern: Mapping[str, int] | None = None,
                alpha_pattern: Mapping[str, float] | None = None,
                use_dora: bool = False) -> LoraConfig:
    # init_lora_weights=True: A random, B zero, so a fresh adapter changes nothing (DoRA's
    # magnitude starts at the base weight's norm, so it changes nothing either).
    # rank_pattern/alpha_pattern: per-module rank and alpha (LoCon's conv rank).
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                      target_modules=target_modules, init_lora_weights=True, bias="none",
                      rank_pattern=dict(rank_pattern or {}),
                      alpha_pattern=dict(alpha_pattern or {}), use_dora=use_dora)
