"""The real, full-size configs of FLUX.1 Kontext's parts (the shapes only: no weights),
keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used and
checked."""

from __future__ import annotations

from aitk.models.flux.real_parts import FLUX1, flux1_transformer
from aitk.models.real_parts import RealPart

REAL_PARTS: dict[tuple[str, str], RealPart] = {
    # Kontext dev has FLUX.1 dev's shapes (guidance embedding included).
    **{("black-forest-labs/FLUX.1-Kontext-dev", k): v for k, v in
       {**FLUX1, "transformer": flux1_transformer(True)}.items()},
}
