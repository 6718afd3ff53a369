"""The models' errors, in a module without torch so the registry and config checks
can raise and catch them without importing any heavy library."""


class ModelError(Exception):
    """A model that cannot do what was asked (bad folder, missing part, unloaded TE)."""


class ModelLoadError(ModelError):
    """`load_model()` failed: the message names the path and what is missing."""
