"""Trainable adapters (LoRA, LoKr) through peft; see aitk.adapters.network."""

from aitk.adapters.network import AdapterNetwork

__all__ = ["AdapterNetwork"]
