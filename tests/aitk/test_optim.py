"""LR schedules (pure in the step) and optimizer construction."""

from __future__ import annotations

import builtins

import pytest
import torch

from aitk.errors import OptimizerUnavailable
from aitk.run.optim import Schedule, build_optimizer, lr_at


def test_constant_with_warmup_ramps_linearly_then_holds():
    s = Schedule(1e-3, 100, "constant", warmup_steps=4)
    assert [lr_at(i, s) for i in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_linear_decays_to_eta_min_at_the_end():
    s = Schedule(1.0, 10, "linear", eta_min=0.1)
    assert lr_at(0, s) == pytest.approx(1.0)
    assert lr_at(5, s) == pytest.approx(0.55)
    assert lr_at(10, s) == pytest.approx(0.1)


def test_cosine_after_warmup():
    s = Schedule(1.0, 12, "cosine", warmup_steps=2)
    assert lr_at(1, s) == pytest.approx(1.0)
    assert lr_at(2, s) == pytest.approx(1.0)
    assert lr_at(7, s) == pytest.approx(0.5)
    assert lr_at(12, s) == pytest.approx(0.0, abs=1e-12)


def test_schedule_depends_on_the_step_alone():
    s = Schedule(1e-3, 50, "cosine", warmup_steps=5)
    first = [lr_at(i, s) for i in range(50)]
    assert [lr_at(i, s) for i in reversed(range(50))][::-1] == first


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown lr_scheduler"):
        Schedule(1e-3, 10, "polynomial")


def test_adamw_gets_the_settings():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer("adamw", [p], 1e-3, 0.05, (0.8, 0.9), 1e-6)
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["weight_decay"] == 0.05
    assert opt.param_groups[0]["betas"] == (0.8, 0.9)


def test_adamw8bit_without_bitsandbytes_is_a_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_bnb(name, *args, **kwargs):
        if name == "bitsandbytes":
            raise ImportError("no bitsandbytes")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(OptimizerUnavailable, match="needs bitsandbytes"):
        build_optimizer("adamw8bit", [torch.nn.Parameter(torch.zeros(1))], 1e-3, 0.0,
                        (0.9, 0.999), 1e-8)


def test_nothing_trainable_is_an_error():
    with pytest.raises(ValueError, match="nothing to train"):
        build_optimizer("adamw", [torch.nn.Parameter(torch.zeros(1), requires_grad=False)],
                        1e-3, 0.0, (0.9, 0.999), 1e-8)
