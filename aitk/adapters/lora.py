"""LoRA through peft: `LoraConfig` injected on the Linear layers of the model's blocks."""

from __future__ import annotations

from peft import LoraConfig


def lora_config(target_modules: list[str], rank: int, alpha: float,
                dropout: float) -> LoraConfig:
    # init_lora_weights=True: A random, B zero, so a fresh adapter changes nothing.
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                      target_modules=target_modules, init_lora_weights=True, bias="none")
