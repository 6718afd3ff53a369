"""The example's image measure: distance from each preview to the training image of its
prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aitk.models.example.likeness import caption_key, captioned_images, mean_distance

REPO = Path(__file__).resolve().parents[3]
FOLDER = REPO / "datasets" / "example"
RED_ON_BLUE = "[trigger] a red circle on a blue background"


def flat(tmp_path: Path, name: str, rgb: tuple[int, int, int]) -> Path:
    path = tmp_path / name
    Image.fromarray(np.tile(np.array(rgb, np.uint8), (32, 32, 1))).save(path)
    return path


def test_the_training_image_of_the_prompt_is_at_distance_0(tmp_path: Path) -> None:
    same = tmp_path / "same.png"
    Image.open(FOLDER / "red_circle_blue.png").convert("RGB").resize((32, 32)).save(same)
    lime = flat(tmp_path, "lime.png", (0, 255, 0))

    assert mean_distance([(same, RED_ON_BLUE)], FOLDER, "p1xel") < 0.02
    far = mean_distance([(lime, RED_ON_BLUE)], FOLDER, "p1xel")
    assert 0.3 < far < 0.9
    both = mean_distance([(same, RED_ON_BLUE), (lime, RED_ON_BLUE)], FOLDER, "p1xel")
    assert abs(both - (mean_distance([(same, RED_ON_BLUE)], FOLDER) + far) / 2) < 1e-6


def test_a_flat_average_colour_does_not_pass_for_the_picture_asked_for(tmp_path: Path):
    """Why the measure pairs by prompt: a plain grey square is close to the grey-
    background training image, so "nearest training image" would call it a good preview
    of a red circle on blue."""
    grey = flat(tmp_path, "grey.png", (128, 128, 128))
    asked = mean_distance([(grey, RED_ON_BLUE)], FOLDER)
    other = mean_distance([(grey, "a purple circle on a gray background")], FOLDER)
    assert other < 0.1 < asked


def test_prompts_match_captions_whatever_the_trigger_and_style_words() -> None:
    assert caption_key("[trigger] style, a Yellow circle on a black background.", "p1xel") \
        == caption_key("p1xel a yellow circle on a black background", "p1xel") \
        == "a yellow circle on a black background"
    keys = captioned_images(FOLDER, trigger="p1xel")
    assert len(keys) == 6 and keys["a red circle on a blue background"].name \
        == "red_circle_blue.png"


def test_a_prompt_no_training_image_has_is_an_error(tmp_path: Path) -> None:
    grey = flat(tmp_path, "grey.png", (128, 128, 128))
    with pytest.raises(ValueError, match="captioned 'a green triangle'"):
        mean_distance([(grey, "a green triangle")], FOLDER)
    with pytest.raises(ValueError, match="no previews"):
        mean_distance([], FOLDER)
