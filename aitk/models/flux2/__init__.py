"""The `flux2` arch: FLUX.2 [dev] through diffusers, on the FLUX.2 latents, ids, shift
and LoRA layout of aitk.models.flux2_klein.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
