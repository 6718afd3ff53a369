"""Trainable adapters (LoRA, LoKr) through peft; see aitk.adapters.network."""

from aitk.adapters.network import AdapterError, AdapterNetwork

__all__ = ["AdapterError", "AdapterNetwork"]
