"""The `hidream` arch: HiDream-I1 Full, Dev and Fast through diffusers.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
