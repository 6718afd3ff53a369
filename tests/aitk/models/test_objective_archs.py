"""The extra loss terms through the BaseModel hooks and the real adapter on tiny models of
several archs: the preservation prior is the base model (the LoRA disabled through
AdapterNetwork.disabled), the term equals the one computed by hand, a prior draws no
random numbers, and do_guidance_loss feeds Flux's guidance embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.models.flux.model import FluxModel
from aitk.models.registry import load_model
from aitk.models.sdxl.model import SDXLModel
from aitk.models.wan21.model import Wan21Model
from aitk.run.objectives import Guidance, InvertedMaskPrior, Objective, Preservation
from aitk.run.train import compute_loss, step_generator
from tests.aitk.models.arch_checks import model_cfg, randomise, tiny_model_folder, train_cfg
from tests.aitk.models.conftest import NetCfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

flux_dir = tiny_model_folder(FluxModel)
sdxl_dir = tiny_model_folder(SDXLModel, scope="session")
wan_dir = tiny_model_folder(Wan21Model)
ARCHS = {"example": "example_dir", "flux": "flux_dir", "sdxl": "sdxl_dir",
         "wan21": "wan_dir"}


@pytest.fixture(params=sorted(ARCHS))
def setup(request):
    arch = request.param
    folder = request.getfixturevalue(ARCHS[arch])
    model = load_model(model_cfg(arch, folder))
    model.configure_training(train_cfg())
    net = AdapterNetwork.attach(model, NetCfg(dropout=0.5))
    randomise(net)
    model.get_model_to_train().train()
    gen = torch.Generator().manual_seed(0)
    shape = (2, 3, 1, 32, 32) if model.is_video else (2, 3, 32, 32)
    with torch.no_grad():
        latents = model.encode_images(torch.rand(shape, generator=gen) * 2 - 1)
        embeds = model.get_prompt_embeds(["p1x a red circle", "a p1x square"])
    batch = DataBatch(captions=["p1x a red circle", "a p1x square"], latents=latents,
                      prompt_embeds=embeds, original_sizes=[(32, 32)] * 2,
                      crop_coords_top_left=[(0, 0)] * 2)
    return model, net, batch


def embed_with(model):
    def embed(captions, batch):
        with torch.no_grad():
            return model.get_prompt_embeds(captions)
    return embed


def by_hand_prior(model, net, step_inputs, embeds, batch):
    """The base model's prediction another way: the LoRA's scale set to 0."""
    x, t = step_inputs
    module = model.get_model_to_train()
    was = module.training
    module.eval()
    net.set_multiplier(0.0)
    try:
        with torch.no_grad():
            return model.get_noise_prediction(x, t, embeds, batch=batch)
    finally:
        net.set_multiplier(1.0)
        module.train(was)


def test_the_preservation_term_is_the_adapter_against_the_base_model(setup):
    model, net, batch = setup
    seen = []
    real = model.get_noise_prediction

    def spy(x, t, embeds, **kwargs):
        seen.append((x.detach().clone(), t.detach().clone()))
        return real(x, t, embeds, **kwargs)

    model.get_noise_prediction = spy
    dop = Preservation("diff_output_preservation",
                       lambda b: [c.replace("p1x", "shape") for c in b.captions],
                       embed_with(model), net, multiplier=1.0)
    module = model.get_model_to_train()
    module.eval()  # adapter dropout off: the main pass is then the same in both runs
    rng = torch.get_rng_state()
    with_dop = compute_loss(model, batch, step_generator(3, 1, 0), Objective(terms=(dop,)))
    assert torch.equal(rng, torch.get_rng_state())  # the prior drew nothing
    plain = compute_loss(model, batch, step_generator(3, 1, 0))
    model.get_noise_prediction = real
    assert net.enabled and len(seen) == 4  # main, prior, preservation; main again
    inputs = seen[0]
    class_embeds = model.get_prompt_embeds(["shape a red circle", "a shape square"])
    base = by_hand_prior(model, net, inputs, class_embeds, batch)
    with torch.no_grad():
        ours = model.get_noise_prediction(*inputs, class_embeds, batch=batch)
    by_hand = torch.nn.functional.mse_loss(ours.float(), base.float())
    assert by_hand > 0
    assert (with_dop - plain).item() == pytest.approx(by_hand.item(), rel=1e-4, abs=1e-7)


def test_the_inverted_mask_prior_reaches_only_the_lora(setup):
    model, net, batch = setup
    h, w = 32, 32
    batch.mask = torch.ones(2, 1, h, w)
    batch.mask[..., : w // 2] = 0.0
    term = InvertedMaskPrior(net, multiplier=1.0)
    loss = compute_loss(model, batch, step_generator(3, 1, 0), Objective(terms=(term,)))
    loss.backward()
    lora = {id(p) for p in net.trainable_parameters()}
    assert all(p.grad is None for p in model.get_model_to_train().parameters()
               if id(p) not in lora)
    assert any(p.grad is not None and p.grad.abs().max() > 0
               for p in net.trainable_parameters())


def test_guidance_loss_feeds_fluxs_guidance_embedding_the_target_scale(flux_dir: Path):
    model = load_model(model_cfg("flux", flux_dir))
    model.configure_training(train_cfg(cfg_scale=1.0))
    net = AdapterNetwork.attach(model, NetCfg())
    randomise(net)
    with torch.no_grad():
        latents = model.encode_images(torch.zeros(1, 3, 32, 32))
    batch = DataBatch(captions=["a"], latents=latents,
                      prompt_embeds=model.get_prompt_embeds(["a"]))
    fed = []
    real = model.model.forward

    def spy(*args, **kwargs):
        fed.append(kwargs["guidance"].clone())
        return real(*args, **kwargs)

    model.model.forward = spy
    compute_loss(model, batch, step_generator(0, 0, 0),
                 Objective(guidance=Guidance(embed_with(model), target=3.5)))
    assert [g.tolist() for g in fed] == [[3.5], [3.5]]  # the step's and the unconditional
    fed.clear()
    compute_loss(model, batch, step_generator(0, 0, 0))
    assert [g.tolist() for g in fed] == [[1.0]]  # cfg_scale again once the step is done
