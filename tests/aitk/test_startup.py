"""Startup imports: a config error and `python -m aitk models` need no heavy library.

Checked through the import graph (`python -X importtime`) of the real entry points, not
by timing: torch, diffusers and transformers take seconds to import, and a user who
mistyped a key should get the answer at once. bench/startup.py measures the time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "diffusers", "transformers", "safetensors", "peft", "optimum", "numpy")


def imported_modules(*args: str, cwd: Path = REPO) -> tuple[set[str], subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    return names, done


def heavy(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in HEAVY}


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    "job: extension\nconfig:\n  name: x\n  process:\n    - type: sd_trainer\n      netwrk: {}\n",
    # A config whose only problem is an unknown arch: the registry answers from its table.
    "job: extension\nconfig:\n  name: x\n  process:\n    - type: sd_trainer\n"
    "      network: {type: lora}\n      datasets: [{folder_path: d}]\n"
    "      model: {arch: exampel, name_or_path: m}\n",
], ids=["misspelt-key", "unknown-arch"])
def test_a_config_error_imports_no_heavy_library(tmp_path, config):
    path = tmp_path / "job.yaml"
    path.write_text(config)
    names, done = imported_modules(str(REPO / "run.py"), str(path))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "config error" in done.stderr
    assert "pydantic" in names and "yaml" in names  # the probe sees real imports
    assert heavy(names) == set()


def test_listing_models_imports_no_heavy_library():
    names, done = imported_modules("-m", "aitk", "models", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"example"' in done.stdout
    assert heavy(names) == set()
