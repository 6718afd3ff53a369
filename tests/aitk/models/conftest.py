"""Fixtures for the model-side tests over the session's one tiny example model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from aitk.models.registry import load_model


@dataclass
class ModelCfg:
    """Stands in for the trainer's `model:` section (aitk.models.base.ModelSettings, and
    the optional knobs of aitk.config.schema.ModelConfig that some archs read)."""

    name_or_path: str
    arch: str = "example"
    quantize: bool = False
    quantize_te: bool = False
    qtype: str = "qfloat8"
    qtype_te: str = "qfloat8"
    low_vram: bool = False
    assistant_lora_path: str | None = None
    extras_name_or_path: str | None = None
    is_v_pred: bool | None = None
    attn_masking: bool = False
    model_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class NetCfg:
    """Stands in for the trainer's `network:` section."""

    type: str = "lora"
    linear: int = 4
    linear_alpha: float = 4.0
    dropout: float = 0.0
    network_kwargs: dict[str, Any] = field(default_factory=dict)
    train_text_encoder: bool = False  # the job's train.train_text_encoder


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module (`pytestmark = pytest.mark.usefixtures(...)`):
    with tiny layers on a shared 2-core box, OpenMP threads waiting on each other cost
    10-40x the work itself (measured on SDXL: 2 s vs 0.05 s of CPU per step)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def example_dir(example_model_dir: Path) -> Path:
    """The session's one tiny example model (tests/conftest.py), by this folder's name."""
    return example_model_dir


@pytest.fixture
def make_cfg():
    """ModelCfg(name_or_path=..., **overrides), for tests that take it as a fixture."""
    return ModelCfg


@pytest.fixture
def net_cfg():
    return NetCfg


@pytest.fixture
def make_model(example_dir: Path):
    def make(**overrides: Any):
        return load_model(ModelCfg(name_or_path=str(example_dir), **overrides))

    return make


@pytest.fixture
def model(make_model):
    return make_model()


@pytest.fixture
def inputs(model):
    """A fixed batch: latents for a 64x96 image pair, timesteps, two prompts."""
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 16, 24, generator=gen)
    timesteps = torch.tensor([250.0, 800.0])
    embeds = model.get_prompt_embeds(["a red square on grey", "cat"])
    return latents, timesteps, embeds


@pytest.fixture
def hub_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No hub for this test: HF_HUB_OFFLINE and an empty HF_HOME, set in huggingface_hub's
    constants too, which it reads once at import (else a hub id is looked up on the
    network). Returns the empty hub folder."""
    import huggingface_hub.constants

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home))
    return home
