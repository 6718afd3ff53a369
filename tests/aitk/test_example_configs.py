"""Every shipped example config loads, and every tiny CPU example trains end to end as
shipped: run from a scratch folder where `datasets/` is the checkout's, so relative
paths resolve as they do for a user in the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from aitk.cli.run import main as cli_main
from aitk.config.loading import load_config
from aitk.models import catalog
from tests.aitk.aitk_testing import REPO, scratch_checkout

EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))
TINY = [p for p in EXAMPLES if p.name.endswith("_tiny_cpu.yaml")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_config_loads(path: Path):
    loaded = load_config(str(path))
    assert loaded.job.config.process and not loaded.warnings


@pytest.mark.slow
@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_tiny_example_trains_end_to_end(path: Path, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(scratch_checkout(tmp_path))
    assert cli_main([str(path)]) == 0
    loaded = load_config(str(path))
    name, proc = loaded.name, loaded.job.config.process[0]
    out = tmp_path / proc.training_folder / name
    # Multi-expert archs (wan22_14b) write one file per expert instead of NAME.safetensors.
    finals = [p for p in (out / f"{name}{s}.safetensors"
                          for s in ("", "_high_noise", "_low_noise")) if p.exists()]
    assert finals
    # The file keeps alpha as `.alpha` keys unless its arch folds it into the up weights.
    alpha_keys = catalog.description(proc.model.arch).lora.alpha_keys
    for final in finals:
        lora = load_file(final)
        assert lora and any(k.endswith(".alpha") for k in lora) == alpha_keys
    assert list((out / "samples").glob(f"{proc.train.steps:09d}_*.png"))
