"""Built-in model archs: arch -> "module:Class", imported only when a job asks for one.

Naming the class instead of importing it keeps `python -m aitk models` and config
checks free of torch and diffusers. Add an arch here to register it.
"""

BUILTIN_ARCHS: dict[str, str] = {
    "example": "aitk.models.example.model:ExampleModel",
    "flux": "aitk.models.flux.model:FluxModel",
    "qwen_image": "aitk.models.qwen_image.model:QwenImageModel",
    "qwen_image_edit": "aitk.models.qwen_image_edit.model:QwenImageEditModel",
    "qwen_image_edit_plus": "aitk.models.qwen_image_edit.model:QwenImageEditPlusModel",
    "sdxl": "aitk.models.sdxl.model:SDXLModel",
}
