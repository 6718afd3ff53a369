"""The Qwen-Image-Edit archs: `qwen_image_edit` and `qwen_image_edit_plus`.

`arch.py` describes it without torch, `model.py` is the model (torch); this `__init__`
imports neither, so `aitk.models.catalog` reads `arch.py` alone.
"""
