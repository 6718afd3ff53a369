"""The `krea2` arch: Krea 2 (raw, and Turbo with its training adapter) through diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch), `lora_keys.py` its
LoRA file layout; this `__init__` imports none of them, so `aitk.models.catalog` reads
`arch.py` alone.
"""
