"""`model.layer_offloading` (aitk.models.block_offload): the share of blocks it offloads,
that share held out of the compute device at every block's forward and recompute (seen
by forward hooks of the test's own), the adapter untouched, the same gradients, and a
whole job training the same LoRA with offloading as without."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.errors import EXIT_OK
from aitk.models.block_offload import offload_part, offloaded_indices
from aitk.models.description import PartRole
from aitk.models.flux.model import FluxModel
from aitk.models.flux.tiny import FluxSizes, build_tiny_flux
from aitk.models.registry import load_model
from aitk.run.job import run_job
from tests.aitk.models.arch_checks import model_cfg, train_cfg, write_lora_job
from tests.aitk.models.conftest import NetCfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCKS = 4  # 2 double-stream + 2 single-stream


@pytest.mark.parametrize(("count", "share", "chosen"), [
    (4, 0.5, [1, 3]), (4, 1.0, [0, 1, 2, 3]), (4, 0.0, []), (4, 0.25, [3]),
    (57, 0.4, None), (3, 0.5, None)])
def test_the_share_is_round_share_times_blocks_spread_evenly(count, share, chosen):
    found = offloaded_indices(count, share)
    assert len(found) == round(share * count)
    assert found == sorted(set(found)) and all(0 <= i < count for i in found)
    if chosen is not None:
        assert found == chosen
    if len(found) > 1:  # spread: no two gaps differ by more than one block
        gaps = [b - a for a, b in zip(found, found[1:], strict=False)]
        assert max(gaps) - min(gaps) <= 1


@pytest.fixture(scope="module")
def flux4_dir(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("flux4") / "model"
    build_tiny_flux(target, sizes=FluxSizes(num_layers=2, num_single_layers=2,
                                            text_layers=2))
    return target


def loaded(flux4_dir: Path, **cfg) -> FluxModel:
    model = load_model(model_cfg("flux", flux4_dir, **cfg))
    model.configure_training(train_cfg())
    return model


def frozen(block: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in (*block.parameters(), *block.buffers()) if not t.requires_grad]


class Residency:
    """Forward pre-hooks on every block: at each block's forward, which blocks hold
    their weights elsewhere than where they rest (the storage seen at install time)."""

    def __init__(self, blocks: list[torch.nn.Module]) -> None:
        self.blocks = blocks
        self.rest = [{t.data_ptr() for t in frozen(b)} for b in blocks]
        self.seen: list[tuple[int, set[int]]] = []  # (running block, blocks away from rest)
        self.handles = [b.register_forward_pre_hook(lambda m, a, i=i: self._look(i))
                        for i, b in enumerate(blocks)]

    def _look(self, running: int) -> None:
        away = {i for i, b in enumerate(self.blocks)
                if any(t.data_ptr() not in self.rest[i] for t in frozen(b))}
        self.seen.append((running, away))


def step(model: FluxModel, checkpointing: bool) -> list[torch.Tensor]:
    """One prediction and backward; the adapter's gradients."""
    if checkpointing:
        model.model.enable_gradient_checkpointing()
    model.model.train()
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 4, 6, generator=gen)
    embeds = model.get_prompt_embeds(["a red square", "cat"])
    pred = model.get_noise_prediction(latents, torch.tensor([250.0, 800.0]), embeds)
    pred.float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.model.parameters() if p.requires_grad]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_offloaded_share_stays_off_the_device_at_every_block(flux4_dir, checkpointing):
    model = loaded(flux4_dir)
    torch.manual_seed(0)
    AdapterNetwork.attach(model, NetCfg())
    blocks = model.offload_blocks(PartRole.DENOISER)
    assert len(blocks) == BLOCKS
    adapter = {id(p): p.data_ptr() for p in model.model.parameters() if p.requires_grad}
    offloader = offload_part(model, PartRole.DENOISER, 0.5)
    offloaded = set(offloaded_indices(BLOCKS, 0.5))
    watch = Residency(blocks)
    step(model, checkpointing)
    visits = BLOCKS * (2 if checkpointing else 1)  # the recompute visits again
    assert len(watch.seen) == visits
    for running, away in watch.seen:
        # The running block is the only offloaded one on the device (no side stream on
        # the CPU, so nothing is prefetched); the other offloaded one rests in CPU memory.
        assert away == ({running} & offloaded), (running, away)
    assert offloader.moves == len(offloaded) * (2 if checkpointing else 1)
    assert offloader.resident() == 0
    # The adapter was never moved or copied: it trains where it was made.
    assert adapter == {id(p): p.data_ptr() for p in model.model.parameters()
                       if p.requires_grad}


@pytest.mark.parametrize("quantized", [False, True])
def test_offloading_changes_no_gradient(flux4_dir, quantized):
    grads = []
    for share in (0.0, 1.0):
        model = loaded(flux4_dir, quantize=quantized)
        torch.manual_seed(0)
        AdapterNetwork.attach(model, NetCfg())
        for p in model.model.parameters():  # a zero B would give A no gradient
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.1)
        offload_part(model, PartRole.DENOISER, share)
        grads.append(step(model, checkpointing=True))
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_text_encoder_layers_are_offloaded_too(flux4_dir):
    model = loaded(flux4_dir)
    layers = model.offload_blocks(PartRole.TEXT_ENCODER)
    assert len(layers) == 4  # CLIP's 2 layers and T5's 2 blocks
    before = model.get_prompt_embeds(["a red square"])
    offloader = offload_part(model, PartRole.TEXT_ENCODER, 1.0)
    after = model.get_prompt_embeds(["a red square"])
    assert offloader.moves == 4 and offloader.resident() == 0
    assert torch.equal(before.text_embeds[0], after.text_embeds[0])
    assert torch.equal(before.pooled_embeds[0], after.pooled_embeds[0])


@pytest.mark.slow
def test_a_job_trains_the_same_lora_with_offloading(tmp_path: Path, flux4_dir: Path,
                                                   capsys):
    files = []
    for name, offload in (("plain", {}), ("offloaded", {
            "layer_offloading": True, "layer_offloading_transformer_percent": 0.5,
            "layer_offloading_text_encoder_percent": 1.0})):
        job = write_lora_job(tmp_path, name, "flux", flux4_dir,
                             model={"arch": "flux", "name_or_path": str(flux4_dir),
                                    **offload},
                             train={"gradient_checkpointing": True, "lr": 5e-3})
        assert run_job(load_config(str(job))) == EXIT_OK
        files.append(load_file(tmp_path / "out" / name / f"{name}.safetensors"))
    out = capsys.readouterr()
    said = out.out + out.err
    assert "layer offloading: 2 denoiser blocks" in said  # the share acted
    assert "layer offloading: 4 text_encoder blocks" in said
    plain, offloaded = files
    assert plain.keys() == offloaded.keys()
    assert any(v.abs().sum() > 0 for k, v in plain.items() if "lora_B" in k)
    for key in plain:
        assert torch.allclose(plain[key], offloaded[key], atol=1e-6, rtol=0), key
