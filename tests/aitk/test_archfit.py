"""A config must also fit its arch's facts (aitk.config.archfit, read from the torch-free
descriptions): the schedule names it trains with, the clip lengths of video archs."""

from __future__ import annotations

import pytest

from aitk.config.loading import parse_job
from aitk.errors import ConfigError
from tests.aitk.test_config import example_raw, proc


def problems_for(arch: str, **train: object) -> list[str]:
    raw = example_raw()
    proc(raw)["model"]["arch"] = arch
    proc(raw)["train"].update(train)
    try:
        parse_job(raw, "job.yml", env={}, check_arch=None)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("arch, name", [("sdxl", "ddpm"), ("sdxl", "euler"),
                                        ("sd1", "ddpm"), ("sd15", "euler_a"),
                                        ("sd2", "ddim"),
                                        ("flux", "flowmatch"), ("wan21", "flowmatch")])
def test_each_arch_takes_its_own_schedule_names(arch, name):
    assert problems_for(arch, noise_scheduler=name) == []


def test_a_schedule_the_arch_does_not_train_with_is_one_line_naming_its_own():
    assert problems_for("flux", noise_scheduler="ddpm") == [
        "config.process[0].train.noise_scheduler: flux trains with 'flowmatch'; got 'ddpm'"]
    [line] = problems_for("sdxl", noise_scheduler="flowmatch")
    assert line.startswith("config.process[0].train.noise_scheduler: sdxl trains with "
                           "'ddpm' (or upstream's other names for it: ddim, ")


def test_unset_is_the_archs_own():
    assert problems_for("sdxl") == [] and problems_for("flux") == []
    assert problems_for("sd2") == []


def model_problems(arch: str, **model: object) -> list[str]:
    raw = example_raw()
    proc(raw)["model"].update(arch=arch, **model)
    try:
        parse_job(raw, "job.yml", env={}, check_arch=None)
    except ConfigError as exc:
        return exc.problems
    return []


def test_attn_masking_is_flux_only_as_upstream():
    assert model_problems("flux", attn_masking=True) == []
    assert model_problems("sdxl", attn_masking=False) == []
    assert model_problems("sdxl", attn_masking=True) == [
        "config.process[0].model.attn_masking: sdxl has no padded T5 prompt to mask "
        "(upstream's key is for flux); remove it"]
