"""Fixtures for the trainer tests (tests/aitk, except tests/aitk/models)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aitk.aitk_testing import TinyModel, model_settings, write_image

# Tests never reach the model hubs: huggingface_hub reads this once, when first imported,
# so it is set here, before any test module imports it (a test that sets it later still
# waits for connection attempts to time out). Subprocesses inherit it.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture
def tiny_model() -> TinyModel:
    model = TinyModel(model_settings())
    model.load_model()
    return model


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "imgs"
    write_image(folder / "a.png", (64, 48), (200, 30, 30), "a red thing")
    write_image(folder / "b.jpg", (48, 64), (30, 200, 30), "[trigger] a green thing")
    write_image(folder / "c.png", (64, 64), (30, 30, 200), "a blue thing")
    return folder


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module- and session-scoped fixtures (a trained job shared by several tests) are
    set up before any per-test fixture: they get a private cache too, never the
    checkout's cache/."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AITK_CACHE_DIR", str(tmp_path_factory.mktemp("session-cache")))
        yield


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches go to the test's tmp dir, never the checkout's cache/."""
    monkeypatch.setenv("AITK_CACHE_DIR", str(tmp_path / "aitk-cache"))
