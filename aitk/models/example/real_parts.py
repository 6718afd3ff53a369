"""The real, full-size configs of the example model's shipped base (the shapes only: no
weights), keyed by (hub repo, subfolder); aitk.models.real_parts says how they are used
and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aitk.models.real_parts import RealPart


def _example_base() -> dict[str, RealPart]:
    """The shipped example base model: its configs are in the checkout."""
    import json

    root = Path(__file__).resolve().parent / "base"

    def read(part: str) -> dict[str, Any]:
        data = json.loads((root / part / "config.json").read_text(encoding="utf-8"))
        return {k: v for k, v in data.items() if not k.startswith("_")}

    source = "aitk/models/example/base (shipped)"
    return {"transformer": RealPart("aitk", "ExampleTransformer", read("transformer"), source),
            "text_encoder": RealPart("transformers", "T5EncoderModel", read("text_encoder"),
                                     source),
            "vae": RealPart("diffusers", "AutoencoderKL", read("vae"), source)}


REAL_PARTS: dict[tuple[str, str], RealPart] = {
    **{("aitk/models/example/base", k): v for k, v in _example_base().items()},
}
