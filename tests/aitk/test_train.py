"""The loop: gradient accumulation averages, non-finite loss stops, save/sample cadence,
Ctrl+C saves at a step boundary."""

from __future__ import annotations

import pytest
import torch

from aitk.data.batch import DataBatch
from aitk.errors import NonFiniteLoss
from aitk.run.optim import Schedule
from aitk.run.train import (
    LoopSettings,
    Outcome,
    Run,
    compute_loss,
    should_sample,
    step_generator,
    train,
)
from tests.aitk.aitk_testing import TinyAdapter


def batches(model, n: int = 8, size: int = 2):
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        latents = torch.randn(size, 4, 4, 4, generator=gen)
        captions = [f"caption {i} {j}" for j in range(size)]
        with torch.no_grad():
            embeds = model.get_prompt_embeds(captions)
        out.append(DataBatch(captions=captions, latents=latents, prompt_embeds=embeds))
    return out


def make_run(model, adapter, settings, data, events, lr=0.1, optimizer=None, stop=None):
    it = iter(data)
    return Run(model=model, params=adapter.trainable_parameters(),
               optimizer=optimizer or torch.optim.SGD(adapter.trainable_parameters(), lr=lr),
               schedule=Schedule(lr, settings.total_steps), settings=settings,
               next_batch=lambda: next(it),
               save=lambda step: events.append(("save", step)),
               sample=lambda step: events.append(("sample", step)),
               log=lambda step, loss, lr_: events.append(("log", step, loss)),
               stop_requested=stop or (lambda: False))


def test_gradient_accumulation_averages_the_micro_batch_losses(tiny_model):
    adapter = TinyAdapter(tiny_model)
    data = batches(tiny_model, 2)
    events: list = []
    settings = LoopSettings(total_steps=1, accumulation=2, max_grad_norm=0.0, save_every=100,
                            seed=3)
    train(make_run(tiny_model, adapter, settings, data, events, lr=1.0), 0)
    trained = adapter.delta.detach().clone()

    # By hand: gradient of the mean of the two micro-batch losses, one SGD step (lr 1).
    ref = TinyAdapter(tiny_model)
    losses = [compute_loss(tiny_model, b, step_generator(3, 0, m))
              for m, b in enumerate(data)]
    mean = (losses[0] + losses[1]) / 2
    mean.backward()
    expected = -ref.delta.grad
    assert expected.abs().max() > 1e-3  # a summed loss would step twice as far
    assert torch.allclose(trained, expected, atol=1e-6)
    logged = [e for e in events if e[0] == "log"][0][2]
    assert logged == pytest.approx(mean.item(), rel=1e-6)


def test_non_finite_loss_stops_with_the_step_and_keeps_the_weights(tiny_model):
    adapter = TinyAdapter(tiny_model)
    events: list = []
    settings = LoopSettings(total_steps=5, save_every=100)
    run = make_run(tiny_model, adapter, settings, batches(tiny_model), events)
    original = run.log

    def poison(step, loss, lr):  # the loss turns NaN after two good steps
        original(step, loss, lr)
        tiny_model.nan = step >= 2

    run.log = poison
    with pytest.raises(NonFiniteLoss, match="at step 3"):
        train(run, 0)
    assert torch.isfinite(adapter.delta).all()
    assert [e[1] for e in events if e[0] == "log"] == [1, 2]


def test_save_and_sample_cadence(tiny_model):
    adapter = TinyAdapter(tiny_model)
    events: list = []
    settings = LoopSettings(total_steps=5, save_every=2, sample_every=2)
    assert train(make_run(tiny_model, adapter, settings, batches(tiny_model), events), 0) \
        is Outcome.FINISHED
    marks = [e for e in events if e[0] != "log"]
    assert marks == [("sample", 0), ("sample", 2), ("save", 2), ("sample", 4), ("save", 4),
                     ("sample", 5), ("save", 5)]


def test_stop_request_saves_at_the_next_step_boundary(tiny_model):
    adapter = TinyAdapter(tiny_model)
    events: list = []
    settings = LoopSettings(total_steps=50, save_every=100)
    stop_after = 3
    run = make_run(tiny_model, adapter, settings, batches(tiny_model),
                   events, stop=lambda: len([e for e in events if e[0] == "log"]) >= stop_after)
    assert train(run, 0) is Outcome.STOPPED
    assert events[-1] == ("save", 3)


def test_resumed_run_does_not_resample_or_resave_its_start_step():
    s = LoopSettings(total_steps=10, sample_every=5, sample_first=True)
    assert should_sample(0, 0, s)
    assert not should_sample(5, 5, s)
    assert should_sample(10, 5, s)
    assert not should_sample(0, 0, LoopSettings(total_steps=10, sample_every=5,
                                                sample_first=False))
    assert not should_sample(5, 0, LoopSettings(total_steps=10, sample_every=None))


def test_sample_start_step_holds_the_cadence_previews_back(tiny_model):
    """Upstream's rule: cadence previews from sample_start_step on; the step-0 baseline
    is skip_first_sample's and the last step always previews."""
    adapter = TinyAdapter(tiny_model)
    for first, expected in ((True, [0, 4, 6, 7]), (False, [4, 6, 7])):
        events: list = []
        settings = LoopSettings(total_steps=7, save_every=100, sample_every=2,
                                sample_first=first, sample_start=3)
        train(make_run(tiny_model, adapter, settings, batches(tiny_model, 7), events), 0)
        assert [e[1] for e in events if e[0] == "sample"] == expected


def test_step_generator_depends_on_seed_step_and_micro_only():
    a = torch.randn(4, generator=step_generator(1, 7, 0))
    assert torch.equal(a, torch.randn(4, generator=step_generator(1, 7, 0)))
    assert not torch.equal(a, torch.randn(4, generator=step_generator(1, 7, 1)))
    assert not torch.equal(a, torch.randn(4, generator=step_generator(1, 8, 0)))


def test_save_now_and_sample_now_are_taken_at_the_next_step_boundary(tiny_model, tmp_path):
    """The web UI's "save now" / "sample now" (aitk_common.requests): a file in the
    request folder, taken once at a step boundary, between the usual cadence."""
    from aitk_common import requests
    from aitk_common.requests import Request

    adapter = TinyAdapter(tiny_model)
    events: list = []
    settings = LoopSettings(total_steps=6, save_every=100, sample_every=100,
                            sample_first=False)
    run = make_run(tiny_model, adapter, settings, batches(tiny_model), events)
    folder = tmp_path / "requests"
    original = run.log

    def ask_at_step_two(step, loss, lr):
        original(step, loss, lr)
        if step == 2:  # asked twice mid-run: one request
            requests.ask(folder, Request.SAVE)
            requests.ask(folder, Request.SAVE)
            requests.ask(folder, Request.SAMPLE)

    run.log = ask_at_step_two
    run.requested = lambda: requests.take(folder)
    assert train(run, 0) is Outcome.FINISHED
    marks = [e for e in events if e[0] != "log"]
    assert marks == [("sample", 2), ("save", 2), ("sample", 6), ("save", 6)]
    assert requests.pending(folder) == frozenset()
