"""The tiny random Qwen2.5-VL and Qwen3-VL (aitk.caption.tiny), each built once per
session in a folder whose path has a space, and a small dataset folder for each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from aitk.caption.tiny import build_tiny_vlm
from tests.aitk.aitk_testing import write_image


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-VL, the default model's family."""
    return build_tiny_vlm(tmp_path_factory.mktemp("caption models") / "tiny vlm")


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("caption models") / "tiny qwen3 vl",
                          family="qwen3_vl")


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """a.png and c.jpg without captions, b.png with one."""
    folder = tmp_path / "my pictures"
    write_image(folder / "a.png", (64, 48), (200, 30, 30))
    write_image(folder / "b.png", (48, 64), (30, 200, 30), "a green thing, by hand")
    write_image(folder / "c.jpg", (64, 64), (30, 30, 200))
    return folder
