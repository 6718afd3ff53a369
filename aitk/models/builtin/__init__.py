"""Built-in model archs: arch -> "module:Class", imported only when a job asks for one.

Naming the class instead of importing it keeps `python -m aitk models` and config
checks free of torch and diffusers. Add an arch here to register it.
"""

BUILTIN_ARCHS: dict[str, str] = {
    "example": "aitk.models.example.model:ExampleModel",
    "flux": "aitk.models.flux.model:FluxModel",
    "qwen_image": "aitk.models.qwen_image.model:QwenImageModel",
    "sdxl": "aitk.models.sdxl.model:SDXLModel",
    "wan21": "aitk.models.wan21.model:Wan21Model",
    "wan21_i2v": "aitk.models.wan21.model:Wan21I2VModel",
    "wan22_14b": "aitk.models.wan22.model:Wan22Model",
    "wan22_14b_i2v": "aitk.models.wan22.model:Wan22I2VModel",
}
