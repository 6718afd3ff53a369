"""Built-in model archs. Add a class to AI_TOOLKIT_MODELS to register it."""

from aitk.models.example import ExampleModel
from aitk.models.qwen_image import QwenImageModel

AI_TOOLKIT_MODELS = [ExampleModel, QwenImageModel]
