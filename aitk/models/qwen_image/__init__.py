from aitk.models.qwen_image.model import QwenImageModel

__all__ = ["QwenImageModel"]
