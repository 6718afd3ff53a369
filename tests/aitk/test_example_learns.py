"""The bundled example teaches something a new user can see (issue 14).

Its previews were noise (a LoRA on a random model learns nothing visible). Now the base
is pre-trained to draw flat scenes (aitk/models/example/base/) and the example LoRA
teaches it the dotted "p1xel" style of datasets/example; this runs the shipped config as
a user does and measures each preview against the training picture of its prompt
(aitk.models.example.likeness).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from aitk.cli.run import main as cli_main
from aitk.models.example.likeness import mean_distance
from tests.aitk.aitk_testing import REPO, scratch_checkout

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"


def test_the_example_lora_draws_its_training_pictures_closer_than_the_base(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(scratch_checkout(tmp_path))
    assert cli_main([str(EXAMPLE)]) == 0

    proc = yaml.safe_load(EXAMPLE.read_text())["config"]["process"][0]
    prompts, steps = proc["sample"]["prompts"], proc["train"]["steps"]
    samples = tmp_path / "output" / "example_lora" / "samples"

    def at(step: int) -> float:
        previews = [(samples / f"{step:09d}_{i}.png", p) for i, p in enumerate(prompts)]
        return mean_distance(previews, REPO / "datasets" / "example", proc["trigger_word"])

    before, after = at(0), at(steps)
    # Measured here: 0.301 -> 0.168 (44% closer); a LoRA that learned nothing stays at
    # about 0.30, and one that learned the wrong scenes moves away (see the README's
    # "The example model").
    assert after < 0.75 * before, (before, after)
