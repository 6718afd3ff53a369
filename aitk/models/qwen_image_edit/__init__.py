"""The Qwen-Image-Edit archs: `qwen_image_edit` and `qwen_image_edit_plus` (model.py)."""

from aitk.models.qwen_image_edit.model import QwenImageEditModel, QwenImageEditPlusModel

__all__ = ["QwenImageEditModel", "QwenImageEditPlusModel"]
