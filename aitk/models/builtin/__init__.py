"""Built-in model archs. Add a class to AI_TOOLKIT_MODELS to register it."""

from aitk.models.example import ExampleModel
from aitk.models.flux import FluxModel

AI_TOOLKIT_MODELS = [ExampleModel, FluxModel]
