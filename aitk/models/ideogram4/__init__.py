"""The `ideogram4` arch: Ideogram 4 through diffusers' Ideogram4Pipeline parts.

`arch.py` describes it without torch, `model.py` is the model (torch), `lora_keys.py` its
LoRA file layout; this `__init__` imports none of them, so `aitk.models.catalog` reads
`arch.py` alone.
"""
