"""The real, full-size configs of Qwen-Image-Edit's parts (Qwen-Image's shapes; the vision
tower kept) (the shapes only: no weights), keyed by (hub repo, subfolder);
aitk.models.real_parts says how they are used and checked."""

from __future__ import annotations

from aitk.models.qwen_image.real_parts import QWEN_IMAGE
from aitk.models.real_parts import RealPart

REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("Qwen/Qwen-Image-Edit", k): v for k, v in QWEN_IMAGE.items()},
    **{("Qwen/Qwen-Image-Edit-2509", k): v for k, v in QWEN_IMAGE.items()},
}
