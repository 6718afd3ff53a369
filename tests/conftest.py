"""Suite-wide rules, as plugins (each module's docstring says what it checks):

- tests/spawn_guard.py: a test that starts the trainer carries the `slow` marker.
- tests/checkout_guard.py: no test creates or changes files in the checkout's own
  output/, cache/, .aitk-ui/ or logs/.
- tests/network_guard.py: no test connects to or looks up a host but this machine.

The tiers are described in docs/testing.md. Fixtures every folder shares live here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Torch on one thread for the session and every process it starts (set before anything
# imports torch; a value already in the environment wins). With tiny models on a small
# shared machine, OpenMP threads waiting on each other cost more than the work itself
# (measured on 2 busy cores: tests/aitk/models/test_adapters.py + test_example_model.py
# 33 s -> 20 s, CPU 23 s -> 16 s).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # a plugin imported it first
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

pytest_plugins = ["pytester", "tests.spawn_guard", "tests.checkout_guard",
                  "tests.network_guard"]


@pytest.fixture(scope="session")
def example_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one tiny example model of the session (seed 0, what `python -m aitk
    example-model DIR` writes; built locally, no download). Tests only read it."""
    from aitk.models.example.build import build_example_model

    return build_example_model(tmp_path_factory.mktemp("models") / "example")
