"""LR schedules (pure in the step) and the optimizers a job can name: each takes a step,
its state survives the checkpoint's round trip so a resumed run continues exactly, and
its settings are checked by name."""

from __future__ import annotations

import builtins
import copy
import io

import pytest
import torch

from aitk.config import optimizers
from aitk.config.loading import parse_job, read_config_file
from aitk.errors import ConfigError, OptimizerUnavailable
from aitk.run.automagic import Automagic
from aitk.run.optim import Schedule, build_optimizer, lr_at, schedule_from_config, set_lr
from tests.aitk.aitk_testing import REPO


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


def _torch_lrs(make, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("first,mult", [(5, 1), (3, 2), (4, 3)])
def test_cosine_with_restarts_is_torchs_warm_restarts(first, mult):
    s = Schedule(1.0, 60, "cosine_with_restarts", eta_min=0.05, cycle_steps=first,
                 cycle_mult=mult)
    expected = _torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        o, T_0=first, T_mult=mult, eta_min=0.05), 60)
    assert [lr_at(i, s) for i in range(60)] == pytest.approx(expected)
    assert lr_at(first, s) == pytest.approx(1.0)  # back to the top at the restart


def test_cosine_with_restarts_defaults_to_one_cycle_over_the_run():
    s = Schedule(1.0, 10, "cosine_with_restarts")
    assert [lr_at(i, s) for i in range(10)] == pytest.approx(
        [lr_at(i, Schedule(1.0, 10, "cosine")) for i in range(10)])


def test_step_schedule_is_torchs_step_lr():
    s = Schedule(1.0, 30, "step", step_size=4, gamma=0.5)
    expected = _torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, 4, 0.5), 30)
    assert [lr_at(i, s) for i in range(30)] == pytest.approx(expected)


@pytest.mark.parametrize("kind,extra", [("cosine", {}), ("step", {"step_size": 3}),
                                        ("cosine_with_restarts", {"cycle_steps": 7,
                                                                  "cycle_mult": 2})])
def test_schedule_depends_on_the_step_alone(kind, extra):
    s = Schedule(1e-3, 50, kind, warmup_steps=5, **extra)
    first = [lr_at(i, s) for i in range(50)]
    assert [lr_at(i, s) for i in reversed(range(50))][::-1] == first


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown lr_scheduler"):
        Schedule(1e-3, 10, "polynomial")


# ---- optimizers --------------------------------------------------------------------
def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    """A LoRA-like pair; 64x64 reaches bitsandbytes' 8-bit state size (4096 values)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(64, 64, generator=g) * 0.1),
            torch.nn.Parameter(torch.randn(64, generator=g) * 0.1)]


def _grads(step: int, params: list[torch.nn.Parameter]) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        # a gradient that depends on the weights, like a real loss's
        p.grad = torch.randn(p.shape, generator=g) * 0.01 + 0.05 * p.detach()


def _run(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: range,
         lr: float) -> None:
    for step in steps:
        set_lr(opt, lr)  # as the loop does every step
        _grads(step, params)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _checkpoint_round_trip(opt: torch.optim.Optimizer) -> dict:
    """What aitk.run.saving writes and reads back (weights_only, as resume loads it)."""
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


ALL = list(optimizers.NAMES)


@pytest.mark.parametrize("name", ALL)
def test_each_optimizer_steps_and_resumes_exactly(name):
    lr = optimizers.effective_lr(optimizers.OPTIMIZERS[name], 1e-4)
    whole = _params()
    opt = build_optimizer(name, whole, 1e-4)
    before = [p.detach().clone() for p in whole]
    _run(opt, whole, range(6), lr)
    assert all(not torch.equal(a, b) for a, b in zip(before, whole, strict=True)), \
        f"{name} did not change the weights"

    first = _params()
    opt = build_optimizer(name, first, 1e-4)
    _run(opt, first, range(3), lr)
    state = _checkpoint_round_trip(opt)
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt = build_optimizer(name, resumed, 1e-4)
    opt.load_state_dict(state)
    _run(opt, resumed, range(3, 6), lr)
    for a, b in zip(whole, resumed, strict=True):
        assert torch.equal(a, b), f"{name}: resumed weights differ"


def test_8bit_optimizers_keep_8bit_state():
    for name in ("adamw8bit", "adam8bit", "lion8bit"):
        params = _params()
        opt = build_optimizer(name, params, 1e-3)
        _run(opt, params, range(1), 1e-3)
        assert opt.state[params[0]]["state1"].dtype == torch.uint8, name
    params = _params()
    opt = build_optimizer("prodigy8bit", params, 1e-4)
    _run(opt, params, range(2), 1.0)
    state = opt.state[params[0]]
    assert state["exp_avg_q"].dtype == state["exp_avg_sq_q"].dtype == torch.uint8
    assert "exp_avg" not in state  # only the 8-bit code is kept between steps


def test_prodigy8bit_follows_prodigy_closely():
    """The same algorithm; only the stored moments are rounded to 8 bits."""
    a, b = _params(), _params()
    _run(build_optimizer("prodigy", a, 1.0), a, range(8), 1.0)
    _run(build_optimizer("prodigy8bit", b, 1.0), b, range(8), 1.0)
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, rtol=0, atol=2e-3 * float(x.detach().abs().max()))


def test_upstream_defaults_are_applied():
    p = _params()
    assert build_optimizer("adamw", p, 1e-4).param_groups[0]["eps"] == 1e-6
    assert build_optimizer("prodigy", p, 1e-4).param_groups[0]["lr"] == 1.0  # lr-free
    assert build_optimizer("prodigy", p, 0.5).param_groups[0]["lr"] == 0.5
    ada = build_optimizer("adafactor", p, 1e-3).param_groups[0]
    assert (ada["relative_step"], ada["scale_parameter"], ada["warmup_init"]) == \
        (False, False, False)  # a fixed rate: the LR schedule applies
    opt = build_optimizer("adamw", p, 1e-4, {"weight_decay": 0.2, "betas": [0.8, 0.9]})
    assert opt.param_groups[0]["weight_decay"] == 0.2
    assert opt.param_groups[0]["betas"] == (0.8, 0.9)


def test_adafactor_steps_at_the_given_rate():
    """With relative_step off, Adafactor's first update is lr times the clipped RMS-1
    direction: a step of exactly lr in RMS."""
    p = [torch.nn.Parameter(torch.zeros(8, 8))]
    opt = build_optimizer("adafactor", p, 0.01)
    p[0].grad = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    opt.step()
    rms = float(p[0].detach().pow(2).mean().sqrt())
    assert rms == pytest.approx(0.01, rel=1e-3)


def test_automagic_rates_follow_sign_agreement():
    """Rates start at lr and move by lr_bump: up where the update keeps its sign, down
    where it flips (the first step compares with "negative", as upstream)."""
    p = torch.nn.Parameter(torch.zeros(4))
    opt = Automagic([p], lr=1e-4, lr_bump=1e-5, min_lr=1e-6, max_lr=2e-4)
    grads = [torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([1.0, -1.0, -1.0, 1.0])]
    expected_rates = [torch.tensor([0.9e-4, 1.1e-4, 0.9e-4, 1.1e-4]),
                      torch.tensor([1.0e-4, 1.2e-4, 0.8e-4, 1.0e-4])]
    for grad, rates in zip(grads, expected_rates, strict=True):
        before = p.detach().clone()
        p.grad = grad
        opt.step()
        assert torch.allclose(opt.state[p]["lr_mask"], rates)
        # the update is -rate * (unit-RMS direction): every element moves by its rate
        assert torch.allclose((p.detach() - before).abs(), rates, rtol=1e-4)
        assert torch.equal(torch.sign(p.detach() - before), -torch.sign(grad))
    assert opt.mean_lr() == pytest.approx(float(expected_rates[-1].mean()))


def test_automagic_rates_stay_within_bounds_and_high_start_lr_is_plain_adam():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = Automagic([p], lr=1e-4, lr_bump=1e-4, min_lr=5e-5, max_lr=2e-4)
    for _ in range(5):
        p.grad = torch.ones(3)
        opt.step()
    assert torch.allclose(opt.state[p]["lr_mask"], torch.full((3,), 2e-4))
    spec = optimizers.OPTIMIZERS["automagic"]
    assert optimizers.effective_lr(spec, 1e-2) == 1e-6  # upstream: "Forcing to 1e-6"


@pytest.mark.parametrize("name", ["adamw8bit", "prodigy", "lion", "dadaptation",
                                  "prodigy8bit"])
def test_a_missing_package_is_one_clear_line(monkeypatch, name):
    spec = optimizers.OPTIMIZERS[name]
    blocked = {p.module for p in spec.packages}
    real_import = builtins.__import__

    def without(mod, *args, **kwargs):
        if mod.split(".")[0] in blocked:
            raise ImportError(f"no {mod}")
        return real_import(mod, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    monkeypatch.setattr("importlib.import_module",
                        lambda mod: without(mod))
    with pytest.raises(OptimizerUnavailable) as info:
        build_optimizer(name, _params(), 1e-3)
    message = str(info.value)
    assert message.startswith(f"optimizer {name} needs {spec.packages[0].name}")
    assert "\n" not in message


def test_nothing_trainable_is_an_error():
    with pytest.raises(ValueError, match="nothing to train"):
        build_optimizer("adamw", [torch.nn.Parameter(torch.zeros(1), requires_grad=False)],
                        1e-3)


# ---- the config side -------------------------------------------------------------
def _job(**train):
    raw = copy.deepcopy(read_config_file(REPO / "config" / "examples" /
                                         "train_lora_example_cpu.yaml"))
    raw["config"]["process"][0]["train"].update(train)
    return parse_job(raw, "job.yml", env={}, check_arch=lambda a: None)


def test_optimizer_params_typo_names_the_valid_settings():
    with pytest.raises(ConfigError) as info:
        _job(optimizer="prodigy", optimizer_params={"weight_decay": 0.1, "d_coeff": 2})
    (path, message), = info.value.records
    assert path == "config.process[0].train.optimizer_params"
    assert "'d_coeff' is not a setting of optimizer prodigy" in message
    assert "d_coef" in message and "weight_decay" in message


def test_optimizer_params_are_typed():
    with pytest.raises(ConfigError) as info:
        _job(optimizer="adamw", optimizer_params={"betas": "fast"})
    (path, message), = info.value.records
    assert path == "config.process[0].train.optimizer_params" and "betas" in message


def test_upstream_spellings_of_optimizers_are_accepted():
    assert _job(optimizer="prodigyopt").job.config.process[0].train.optimizer == "prodigy"
    assert _job(optimizer="AdamW8bit").job.config.process[0].train.optimizer == "adamw8bit"
    with pytest.raises(ConfigError) as info:
        _job(optimizer="sgdx")
    assert "automagic" in info.value.problems[0]  # the valid names are listed


def test_schedule_keys_reach_the_schedule():
    tr = _job(lr_scheduler="cosine_with_restarts",
              lr_scheduler_params={"total_iters": 7, "T_mult": 2, "eta_min": 1e-6}
              ).job.config.process[0].train
    s = schedule_from_config(tr)
    assert (s.kind, s.cycle_steps, s.cycle_mult, s.eta_min) == (
        "cosine_with_restarts", 7, 2, 1e-6)
    with pytest.raises(ConfigError, match="step_size"):
        _job(lr_scheduler="step")
    tr = _job(optimizer="prodigy", lr=1e-4).job.config.process[0].train
    assert schedule_from_config(tr).lr == 1.0  # the schedule scales prodigy's multiplier


@pytest.mark.parametrize("name", ["adamw", "lion", "adafactor", "automagic"])
def test_param_groups_keep_their_lr_scale_with_every_optimizer(name):
    """The text encoders' group (`lr_scale`, aitk.run.assembly.parameter_groups) follows
    the one schedule at its own rate, whichever optimizer the job names."""
    if name == "lion":
        pytest.importorskip("lion_pytorch")
    unet, encoder = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = build_optimizer(name, [{"params": [unet]}, {"params": [encoder],
                                                      "lr_scale": 0.25}], 1e-4)
    set_lr(opt, 8e-5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([8e-5, 2e-5])
