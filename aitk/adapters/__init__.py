"""Trainable adapters (LoRA, LoKr) through peft (aitk.adapters.network), and LoRA files
as data: read, rescaled, merged (lora_files), factorised (svd), applied at inference
(hooks).

`AdapterNetwork` imports peft and torch on first use only, so the torch-free readers
here (lora_files.read_layout) stay light for `run.py --check`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdapterNetwork"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from aitk.adapters import network

        return getattr(network, name)
    raise AttributeError(f"module 'aitk.adapters' has no attribute {name!r}")
