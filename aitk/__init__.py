"""aitk: the bundled diffusion trainer (`python run.py CONFIG.yml`).

Never imports the manager: the two are separate programs (see the README).
"""

__version__ = "0.1.0"
SOFTWARE_NAME = "aitk"

# bitsandbytes (the 8-bit optimizers; peft imports it too when it is installed) logs a
# warning at import on CPUs with AVX512-BF16 about an optional 4-bit matmul kernel that
# aitk never uses; it would open every run's output.
import logging as _logging  # noqa: E402

_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
