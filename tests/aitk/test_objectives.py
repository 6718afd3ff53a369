"""The loss terms of a micro-step (aitk.run.objectives) on the tiny stand-in model: each
extra term equals the one computed by hand on a fixed batch, and none draws a random
number."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aitk.data.batch import DataBatch
from aitk.data.dataset import Item
from aitk.run.objectives import (
    Diffusion,
    Guidance,
    InvertedMaskPrior,
    NextSample,
    Objective,
    ObjectiveError,
    Preservation,
    check_objective,
    extra_captions,
    preservation_caption,
    preservation_rules,
)
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import TinyAdapter

TRIGGER = "p1x"


def items(n: int = 2, dataset: int = 0) -> list[Item]:
    return [Item(Path(f"/data/{i}.png"), f"{TRIGGER} thing {i}", (32, 32), (32, 32),
                 dataset=dataset) for i in range(n)]


def batch_of(model, captions: list[str], dataset: int = 0) -> DataBatch:
    latents = torch.randn(len(captions), 4, 4, 4, generator=torch.Generator().manual_seed(3))
    return DataBatch(captions=captions, latents=latents,
                     prompt_embeds=model.get_prompt_embeds(captions),
                     items=items(len(captions), dataset))


def embed_with(model):
    return lambda captions, batch: model.get_prompt_embeds(captions)


def drawn(model, batch, seed=(1, 2, 0)):
    """The step's draws, as the objective makes them."""
    gen = step_generator(*seed)
    clean = batch.latents
    noise = torch.randn(clean.shape, generator=gen)
    t = torch.sigmoid(torch.randn(clean.shape[0], generator=gen)).clamp(1e-5, 1 - 1e-5) * 1000
    s = (t / 1000).view(-1, 1, 1, 1)
    return clean, noise, t, (1 - s) * clean + s * noise


def randomised(model) -> TinyAdapter:
    adapter = TinyAdapter(model)
    with torch.no_grad():
        adapter.delta.copy_(torch.tensor([0.3, -0.2, 0.5, 0.1]))
    return adapter


def test_dop_term_is_the_adapters_class_prediction_against_the_base_models(tiny_model):
    adapter = randomised(tiny_model)
    batch = batch_of(tiny_model, [f"{TRIGGER} a red thing", f"a {TRIGGER} in blue"])
    dop = Preservation("diff_output_preservation",
                       lambda b: [c.replace(TRIGGER, "shape") for c in b.captions],
                       embed_with(tiny_model), adapter, multiplier=0.7)
    with_dop = compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                            Objective(terms=(dop,)))
    plain = compute_loss(tiny_model, batch, step_generator(1, 2, 0))

    clean, noise, t, noisy = drawn(tiny_model, batch)
    class_embeds = tiny_model.get_prompt_embeds(["shape a red thing", "a shape in blue"])
    with adapter.disabled():
        base = tiny_model.get_noise_prediction(noisy, t, class_embeds)
    ours = tiny_model.get_noise_prediction(noisy, t, class_embeds)
    by_hand = torch.nn.functional.mse_loss(ours, base) * 0.7
    assert by_hand > 1e-3  # the adapter changes the class prompt's prediction
    assert (with_dop - plain).item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_bpp_term_uses_the_empty_prompt(tiny_model):
    adapter = randomised(tiny_model)
    batch = batch_of(tiny_model, ["a red thing", "blue"])
    bpp = Preservation("blank_prompt_preservation", lambda b: [""] * len(b),
                       embed_with(tiny_model), adapter, multiplier=1.0)
    term = compute_loss(tiny_model, batch, step_generator(1, 2, 0), Objective(terms=(bpp,))) \
        - compute_loss(tiny_model, batch, step_generator(1, 2, 0))
    clean, noise, t, noisy = drawn(tiny_model, batch)
    blank = tiny_model.get_prompt_embeds(["", ""])
    with adapter.disabled():
        base = tiny_model.get_noise_prediction(noisy, t, blank)
    by_hand = torch.nn.functional.mse_loss(tiny_model.get_noise_prediction(noisy, t, blank),
                                           base)
    assert term.item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_preservation_leaves_out_items_without_a_prompt_and_draws_nothing(tiny_model):
    adapter = randomised(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    half = Preservation("p", lambda b: ["", None], embed_with(tiny_model), adapter)
    full = Preservation("p", lambda b: ["", ""], embed_with(tiny_model), adapter)
    rng = torch.get_rng_state()
    step = compute_loss(tiny_model, batch, step_generator(1, 2, 0), Objective(terms=(half,)))
    assert torch.equal(rng, torch.get_rng_state())  # the prior draws no random numbers
    plain = compute_loss(tiny_model, batch, step_generator(1, 2, 0))
    clean, noise, t, noisy = drawn(tiny_model, batch)
    blank = tiny_model.get_prompt_embeds(["", ""])
    with adapter.disabled():
        base = tiny_model.get_noise_prediction(noisy, t, blank)
    per_item = (tiny_model.get_noise_prediction(noisy, t, blank) - base).pow(2).flatten(1) \
        .mean(1)
    assert (step - plain).item() == pytest.approx(per_item[0].item() / 2, rel=1e-5)
    assert compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                        Objective(terms=(full,))).item() > step.item()
    # the adapter is on again after the prior
    assert tiny_model.model.adapter_delta is adapter.delta


def test_preservation_gradient_reaches_the_adapter(tiny_model):
    adapter = randomised(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    bpp = Preservation("p", lambda b: [""] * 2, embed_with(tiny_model), adapter)
    term = compute_loss(tiny_model, batch, step_generator(1, 2, 0), Objective(terms=(bpp,))) \
        - compute_loss(tiny_model, batch, step_generator(1, 2, 0))
    term.backward()
    assert adapter.delta.grad is not None and adapter.delta.grad.abs().max() > 0


def test_masked_loss_has_no_gradient_where_the_mask_is_zero(tiny_model):
    TinyAdapter(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    batch.mask = torch.ones(2, 1, 16, 16)
    batch.mask[..., :8] = 0.0  # pixel columns 0-7: latent columns 0-1 (4x smaller)
    preds = []
    real = tiny_model.get_noise_prediction

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        out.retain_grad()
        preds.append(out)
        return out

    tiny_model.get_noise_prediction = spy
    compute_loss(tiny_model, batch, step_generator(1, 2, 0)).backward()
    grad = preds[0].grad
    assert grad[..., :2].abs().max() == 0 and grad[..., 2:].abs().min() > 0


def test_masked_loss_keeps_its_scale_a_mean_of_one_over_the_batch(tiny_model):
    TinyAdapter(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    plain = compute_loss(tiny_model, batch, step_generator(1, 2, 0))
    batch.mask = torch.full((2, 1, 16, 16), 0.25)  # a uniform mask changes nothing
    assert compute_loss(tiny_model, batch, step_generator(1, 2, 0)).item() == \
        pytest.approx(plain.item(), rel=1e-5)


def test_inverted_mask_prior_holds_the_masked_out_area_to_the_base_model(tiny_model):
    adapter = randomised(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    batch.mask = torch.ones(2, 1, 16, 16)
    batch.mask[..., :8] = 0.0
    prior_term = InvertedMaskPrior(adapter, multiplier=0.5)
    with_prior = compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                              Objective(terms=(prior_term,)))
    without = compute_loss(tiny_model, batch, step_generator(1, 2, 0))
    clean, noise, t, noisy = drawn(tiny_model, batch)
    embeds = batch.prompt_embeds
    with adapter.disabled():
        base = tiny_model.get_noise_prediction(noisy, t, embeds)
    ours = tiny_model.get_noise_prediction(noisy, t, embeds)
    outside = torch.zeros(2, 1, 4, 4)
    outside[..., :2] = 1.0
    outside = outside / outside.mean()
    by_hand = ((ours - base) ** 2 * outside).flatten(1).mean(1).mean() * 0.5
    assert (with_prior - without).item() == pytest.approx(by_hand.item(), rel=1e-5)
    batch.mask = None  # without masks the term is nothing
    assert compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                        Objective(terms=(prior_term,))).item() == \
        pytest.approx(compute_loss(tiny_model, batch, step_generator(1, 2, 0)).item(),
                      rel=1e-6)


def test_next_sample_trains_at_the_next_level_of_its_own_trajectory(tiny_model):
    from aitk.diffusion.noise import NoiseSettings

    tiny_model.configure_training(SimpleNamespace(timestep_type="next_sample",
                                                  next_sample_timesteps=8))
    assert isinstance(tiny_model.training_schedule.settings, NoiseSettings)
    TinyAdapter(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    seen = []
    real = tiny_model.get_noise_prediction

    def spy(x, t, embeds, **kwargs):
        seen.append((x.detach().clone(), t.detach().clone()))
        return real(x, t, embeds, **kwargs)

    tiny_model.get_noise_prediction = spy
    loss = compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                        Objective(trajectory=NextSample()))
    (x0, t0), (x1, t1) = seen
    table = torch.linspace(1.0, 0.001, 8) * 1000
    assert all(v in table.tolist() for v in t0.tolist())  # drawn from the short schedule
    assert all(table.tolist().index(a) + 1 == table.tolist().index(b)
               for a, b in zip(t0.tolist(), t1.tolist(), strict=True))
    # x1 is one Euler step from x0 along the first prediction
    with torch.no_grad():
        v0 = real(x0, t0, batch.prompt_embeds)
    s0, s1 = (t0 / 1000).view(-1, 1, 1, 1), (t1 / 1000).view(-1, 1, 1, 1)
    assert torch.allclose(x1, x0 + (s1 - s0) * v0, atol=1e-5)
    # ...and the loss scores velocity against the noise that makes x1 x_t1 of the batch
    noise = (x1 - (1 - s1) * batch.latents) / s1
    pred = real(x1, t1, batch.prompt_embeds)
    expected = ((pred - (noise - batch.latents)) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)


def test_guidance_loss_extrapolates_the_target_from_the_unconditional_prediction(tiny_model):
    TinyAdapter(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    guidance = Guidance(embed_with(tiny_model), target=3.0)
    loss = compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                        Objective(guidance=guidance))
    clean, noise, t, noisy = drawn(tiny_model, batch)
    uncond = tiny_model.get_noise_prediction(noisy, t, tiny_model.get_prompt_embeds(["", ""]))
    target = uncond + 3.0 * ((noise - clean) - uncond)
    pred = tiny_model.get_noise_prediction(noisy, t, batch.prompt_embeds)
    assert loss.item() == pytest.approx(((pred - target) ** 2).mean().item(), rel=1e-5)


def test_guidance_scales_per_item_come_from_the_step_generator():
    g = Guidance(lambda c, b: None, target=(2.0, 4.0))
    a = g.scales(3, step_generator(1, 2, 0))
    assert torch.equal(a, g.scales(3, step_generator(1, 2, 0)))
    assert ((a >= 2.0) & (a <= 4.0)).all() and len(set(a.tolist())) == 3
    assert Guidance(lambda c, b: None, target=3.0).scales(2, torch.Generator()).tolist() == \
        [3.0, 3.0]


def test_stepped_and_next_sample_need_a_flow_matching_schedule(tiny_model):
    tiny_model.configure_training(SimpleNamespace(timestep_type="sigmoid"))
    check_objective(SimpleNamespace(loss_type="stepped", timestep_type="next_sample"),
                    tiny_model)  # flow matching: fine
    tiny_model._training_schedule = SimpleNamespace(settings=None)  # no predicted_clean
    with pytest.raises(ObjectiveError, match="loss_type stepped needs a flow-matching arch"):
        check_objective(SimpleNamespace(loss_type="stepped", timestep_type="sigmoid"),
                        tiny_model)


def test_dop_captions_replace_each_datasets_trigger_with_its_class_word():
    ds = [SimpleNamespace(trigger_word=None, diff_output_preservation=False,
                          diff_output_preservation_class=""),
          SimpleNamespace(trigger_word="z0rk", diff_output_preservation=True,
                          diff_output_preservation_class="dog")]
    proc = SimpleNamespace(trigger_word=TRIGGER, datasets=ds, train=SimpleNamespace(
        diff_output_preservation=False, diff_output_preservation_class="person",
        blank_prompt_preservation=True, do_guidance_loss=False, unconditional_prompt=""))
    rules = preservation_rules(proc)
    assert rules[0] is None and rules[1] is not None and rules[1].word == "dog"
    captions = extra_captions(proc)
    assert captions(items(1, dataset=0)[0]) == [""]
    z = Item(Path("/d/z.png"), "z0rk on a sofa", (8, 8), (8, 8), dataset=1)
    assert captions(z) == ["dog on a sofa", ""]
    proc.train.diff_output_preservation = True
    assert preservation_rules(proc)[0].word == "person"  # the train section's word
    assert preservation_caption("p1x, a p1x", TRIGGER, "man") == "man, a man"
    assert preservation_caption("no trigger", None, "man") == "no trigger"


def test_diffusion_term_reads_the_schedules_item_weights(tiny_model):
    tiny_model.configure_training(SimpleNamespace(timestep_type="weighted"))
    TinyAdapter(tiny_model)
    batch = batch_of(tiny_model, ["a", "b"])
    weighted = Objective(Diffusion("mse"))(tiny_model, batch, step_generator(1, 2, 0))
    gen = step_generator(1, 2, 0)
    noise = torch.randn(batch.latents.shape, generator=gen)
    t = torch.rand(2, generator=gen).clamp(1e-5, 1 - 1e-5) * 1000
    s = (t / 1000).view(-1, 1, 1, 1)
    pred = tiny_model.get_noise_prediction((1 - s) * batch.latents + s * noise, t,
                                           batch.prompt_embeds)
    per_item = ((pred - (noise - batch.latents)) ** 2).flatten(1).mean(1)
    w = tiny_model.training_schedule.loss_weights(t)
    assert weighted.item() == pytest.approx((per_item * w).mean().item(), rel=1e-5)


def test_max_loss_clamps_the_diffusion_loss_and_leaves_preservation_on_top(tiny_model):
    """Upstream's `max_loss`: torch.clamp of the step's diffusion loss, so above it the
    loss reads max_loss and no gradient flows from it; preservation is added after."""
    adapter = randomised(tiny_model)
    batch = batch_of(tiny_model, ["a red thing", "blue"])
    plain = compute_loss(tiny_model, batch, step_generator(1, 2, 0))
    assert plain.item() > 0.1
    low = compute_loss(tiny_model, batch, step_generator(1, 2, 0), Objective(max_loss=0.1))
    assert low.item() == pytest.approx(0.1)
    low.backward()
    assert adapter.delta.grad is None or adapter.delta.grad.abs().max() == 0
    high = compute_loss(tiny_model, batch, step_generator(1, 2, 0), Objective(max_loss=1e6))
    assert high.item() == plain.item()
    bpp = Preservation("blank_prompt_preservation", lambda b: [""] * len(b),
                       embed_with(tiny_model), adapter, multiplier=1.0)
    both = compute_loss(tiny_model, batch, step_generator(1, 2, 0),
                        Objective(terms=(bpp,), max_loss=0.1))
    term = compute_loss(tiny_model, batch, step_generator(1, 2, 0), Objective(terms=(bpp,))) \
        - plain
    assert both.item() == pytest.approx(0.1 + term.item(), rel=1e-5)
