"""Built-in model archs: arch -> "module:Class", imported only when a job asks for one.

Naming the class instead of importing it keeps `python -m aitk models` and config
checks free of torch and diffusers. Add an arch here to register it.
"""

BUILTIN_ARCHS: dict[str, str] = {
    "example": "aitk.models.example.model:ExampleModel",
    "chroma": "aitk.models.chroma.model:ChromaModel",
    "flux": "aitk.models.flux.model:FluxModel",
    "flux2_klein": "aitk.models.flux2_klein.model:Flux2KleinModel",
    "flux2_klein_4b": "aitk.models.flux2_klein.model:Flux2Klein4BModel",
    "flux2_klein_9b": "aitk.models.flux2_klein.model:Flux2Klein9BModel",
    "flux_kontext": "aitk.models.flux_kontext.model:FluxKontextModel",
    "prx_pixel": "aitk.models.prx_pixel.model:PRXPixelModel",
    "qwen_image": "aitk.models.qwen_image.model:QwenImageModel",
    "qwen_image_edit": "aitk.models.qwen_image_edit.model:QwenImageEditModel",
    "qwen_image_edit_plus": "aitk.models.qwen_image_edit.model:QwenImageEditPlusModel",
    "sdxl": "aitk.models.sdxl.model:SDXLModel",
    "wan21": "aitk.models.wan21.model:Wan21Model",
    "wan21_i2v": "aitk.models.wan21.model:Wan21I2VModel",
    "wan22_14b": "aitk.models.wan22.model:Wan22Model",
    "wan22_14b_i2v": "aitk.models.wan22.model:Wan22I2VModel",
}
