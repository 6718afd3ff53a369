"""aitk: the bundled diffusion trainer (`python run.py CONFIG.yml`).

Never imports the manager: the two are separate programs (see the README).
"""

__version__ = "0.1.0"
SOFTWARE_NAME = "aitk"
