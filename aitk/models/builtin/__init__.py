"""The built-in arch folders: each `aitk/models/<folder>/` declares its archs in a
torch-free `arch.py` (`DESCRIPTIONS`: name, aliases, the model class as "module:Class",
...; see aitk.models.description), read by aitk.models.catalog.

Adding an arch is its folder plus its folder name here.
"""

ARCH_FOLDERS: tuple[str, ...] = (
    "example",
    "chroma",
    "flux",
    "flux2",
    "flux2_klein",
    "flux_kontext",
    "hidream",
    "ideogram4",
    "krea2",
    "ltx2",
    "lumina2",
    "prx_pixel",
    "qwen_image",
    "qwen_image_edit",
    "sd3",
    "sdxl",
    "stable_diffusion",
    "wan21",
    "wan22",
    "wan22_5b",
    "zimage",
)
