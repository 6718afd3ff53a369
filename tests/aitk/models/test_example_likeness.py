"""The example's image measure: distance from previews to the nearest training image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from aitk.models.example.likeness import mean_distance

REPO = Path(__file__).resolve().parents[3]


def test_a_training_image_is_at_distance_0_and_a_flat_lime_one_is_far(tmp_path: Path):
    folder = REPO / "datasets" / "example"
    same = tmp_path / "same.png"
    Image.open(folder / "red_circle_blue.png").convert("RGB").resize((32, 32)).save(same)
    grey = tmp_path / "lime.png"  # a colour none of them has much of
    Image.fromarray(np.tile(np.array([0, 255, 0], np.uint8), (32, 32, 1))).save(grey)

    assert mean_distance([same], folder) < 0.02
    far = mean_distance([grey], folder)
    assert 0.2 < far < 0.8
    assert abs(mean_distance([same, grey], folder)
               - (mean_distance([same], folder) + far) / 2) < 1e-6
