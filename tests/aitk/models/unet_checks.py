"""What the UNet archs' tests (test_stable_diffusion.py for sd1 / sd2, test_sdxl.py,
test_text_encoder_lora.py) share, beside arch_checks.py: the model as the registry loads
it, a batch and a prediction on it, the arch fixtures, and the checks that are the same
logic for each of them: the DDPM training target, Min-SNR, kohya files read back in
every layout, a real SIGINT mid-step then the exact resume, the stock diffusers pipeline
and its render of a prompt, the UNet block's gradient checkpointing,
the quantized step and the offline hub error of the real entry point. Each arch's file
keeps its own layers, key tables, jobs and tolerances.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.data.batch import DataBatch
from aitk.diffusion import losses as losses_module
from aitk.errors import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK
from aitk.models.base import BaseModel
from aitk.run import train as train_module
from aitk.run.job import run_job
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import REPO
from tests.aitk.models.arch_checks import job_folder, loaded_for_training, randomise, train_cfg
from tests.aitk.models.pipeline_checks import rounded_levels


# ---- the model, its fixtures, a batch -----------------------------------------------------
def registry_model(arch: str, folder: Path, **overrides: Any) -> Any:
    """The model of `arch` at `folder` as the registry loads it, at the trainer's default
    `train:` settings."""
    return loaded_for_training(arch, folder, **overrides)


def arch_fixture(classes: dict[str, type[BaseModel]]) -> Any:
    """A fixture, to bind to `arch`: each arch of `classes` in turn (its test ids)."""

    @pytest.fixture(params=sorted(classes))
    def arch(request: pytest.FixtureRequest) -> str:
        return request.param

    return arch


def folder_fixture() -> Any:
    """A fixture, to bind to `folder`: the tiny model folder of the `arch` fixture's
    arch (the module's `<arch>_dir` fixture)."""

    @pytest.fixture
    def folder(arch: str, request: pytest.FixtureRequest) -> Path:
        return request.getfixturevalue(f"{arch}_dir")

    return folder


def unet_batch(model: BaseModel, size: int = 2) -> DataBatch:
    """`size` (at most 2) seeded random 8x12 latents with the prompts "a red circle" and
    "a green square", embedded now."""
    gen = torch.Generator().manual_seed(1)
    captions = ["a red circle", "a green square"][:size]
    return DataBatch(captions=captions, latents=torch.randn(size, 4, 8, 12, generator=gen),
                     prompt_embeds=model.get_prompt_embeds(captions))


def unet_prediction(model: BaseModel, batch: DataBatch) -> torch.Tensor:
    """The model's prediction on `batch` at timesteps 100 and 700, without gradients."""
    with torch.no_grad():
        return model.get_noise_prediction(batch.latents, torch.tensor([100.0, 700.0]),
                                          batch.prompt_embeds)


# ---- DDPM training ------------------------------------------------------------------------
def assert_ddpm_target_and_every_lora_weight_trains(
        model: BaseModel, net: AdapterNetwork, batch: DataBatch, v_prediction: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real training step's target on `batch` is the DDPM one (the noise, or v) for the
    scaled-linear betas, drawn as the step draws; two AdamW steps then move every LoRA
    weight (A and B, every module)."""
    seen: dict[str, torch.Tensor] = {}
    real_loss = losses_module.diffusion_loss

    def spy(kind, pred, target, *args, **kwargs):
        seen["target"] = target
        return real_loss(kind, pred, target, *args, **kwargs)

    monkeypatch.setattr(losses_module, "diffusion_loss", spy)
    compute_loss(model, batch, step_generator(3, 0, 0))
    gen = step_generator(3, 0, 0)  # the same draws, by hand
    clean = batch.latents
    noise = torch.randn(clean.shape, generator=gen)
    t = torch.randint(0, 1000, (2,), generator=gen)
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    abar = torch.cumprod(1 - betas, 0)[t].float().view(-1, 1, 1, 1)
    expected = noise if not v_prediction else abar.sqrt() * noise - (1 - abar).sqrt() * clean
    assert torch.allclose(seen["target"], expected, atol=1e-5)

    params = net.trainable_parameters()
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for step in range(2):
        optimizer.zero_grad()
        loss = compute_loss(model, batch, step_generator(0, step, 0))
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, params, strict=True))


def assert_min_snr_weights_the_loss(model: BaseModel, batch: DataBatch,
                                    v_prediction: bool) -> None:
    """`min_snr_gamma` 1 changes the loss on `batch`, and the weights are Min-SNR's:
    min(snr, 1) / snr, or / (snr + 1) for v-prediction."""
    with torch.no_grad():
        plain = compute_loss(model, batch, step_generator(5, 0, 0))
        model.configure_training(train_cfg(min_snr_gamma=1.0))
        weighted = compute_loss(model, batch, step_generator(5, 0, 0))
    t = torch.tensor([10.0, 500.0])
    snr = model.training_schedule.snr(t)
    denominator = snr + 1 if v_prediction else snr  # Min-SNR's v-prediction form
    assert torch.allclose(model.training_schedule.loss_weights(t),
                          torch.clamp(snr, max=1.0) / denominator)
    assert not torch.isclose(plain, weighted)


# ---- LoRA files ---------------------------------------------------------------------------
def assert_kohya_file_reads_back_in_every_layout(
        make: Callable[[], BaseModel], net_cfg: Any, tmp_path: Path, module: str) -> None:
    """A random LoRA (`net_cfg`, alpha 2 on rank 4) on `make()`: its file is kohya's
    (`lora_unet_`, `module` with down, up and alpha 2), and a fresh model with it
    predicts the same; so do diffusers' `unet.` layout without alpha (alpha = rank) and
    aitk's older `diffusion_model.` layout with alpha keys."""
    model = make()
    net = AdapterNetwork.attach(model, net_cfg)
    randomise(net, seed=0, scale=0.2)
    batch = unet_batch(model)
    trained = unet_prediction(model, batch)
    path = tmp_path / "lora.safetensors"
    net.save_file(path)
    sd = load_file(path)
    assert {f"{module}.lora_down.weight", f"{module}.lora_up.weight", f"{module}.alpha"} \
        <= set(sd)
    assert all(k.startswith("lora_unet_") for k in sd) and float(sd[f"{module}.alpha"]) == 2

    def reloaded(file: Path) -> torch.Tensor:
        fresh = make()
        AdapterNetwork.attach(fresh, net_cfg).load_file(file)
        return unet_prediction(fresh, batch)

    assert torch.equal(reloaded(path), trained)
    internal = net.state_dict()
    # diffusers' `unet.` layout without alpha keys: alpha = rank (scale 1).
    save_file({"unet." + k: (v * 0.5 if ".lora_B." in k else v) for k, v in internal.items()},
              tmp_path / "unet.safetensors")
    assert torch.allclose(reloaded(tmp_path / "unet.safetensors"), trained, atol=1e-5)
    # aitk's older `diffusion_model.` layout with alpha keys.
    old = {"diffusion_model." + k: v for k, v in internal.items()}
    old.update({"diffusion_model." + m + ".alpha": torch.tensor(2.0)
                for m in {k.rsplit(".lora_", 1)[0] for k in internal}})
    save_file(old, tmp_path / "old.safetensors")
    assert torch.equal(reloaded(tmp_path / "old.safetensors"), trained)


# ---- a real SIGINT, the resume, the preview in diffusers -----------------------------------
def assert_sigint_mid_step_3_then_resume_matches(config: Path, straight: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The job at `config` (written to `<root>/<name>.yml`), a real SIGINT in step 3: it
    exits 130 with step 3's checkpoint; run again it resumes and ends on exactly the
    weights of the same job run straight through into `straight`."""
    real = train_module.compute_loss
    calls = []

    def interrupting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:  # mid step 3: the real handler sets the stop flag
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "compute_loss", interrupting)
    assert run_job(load_config(str(config))) == EXIT_INTERRUPTED
    out = job_folder(config)
    assert (out / "checkpoints" / "step_000000003").is_dir()
    monkeypatch.setattr(train_module, "compute_loss", real)
    assert run_job(load_config(str(config))) == EXIT_OK
    name = f"{config.stem}.safetensors"
    resumed, full = load_file(out / name), load_file(straight / name)
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)




def stock_pipeline(arch: str, folder: Path) -> Any:
    """diffusers' own pipeline for `arch` (sd1 / sd2 / sdxl) from `folder`: no safety
    checker, no watermark, no progress bar."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    if arch == "sdxl":
        pipe = StableDiffusionXLPipeline.from_pretrained(folder, add_watermarker=False)
    else:
        pipe = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None,
                                                       requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def prompt_levels(pipe: Any, prompt: str) -> np.ndarray:
    """`pipe`'s image of `prompt` (its own text encoders) at the jobs' preview settings:
    32x32, 2 steps, guidance 4, seed 1; as levels."""
    out = pipe(prompt=prompt, width=32, height=32, num_inference_steps=2,
               guidance_scale=4.0, generator=torch.Generator().manual_seed(1),
               output_type="np").images[0]
    return rounded_levels(out)






# ---- memory features ----------------------------------------------------------------------
def assert_checkpointing_reruns_the_block_with_the_same_gradients(
        model: BaseModel, net: AdapterNetwork, batch: DataBatch, block: torch.nn.Module,
        train_mode: bool = False) -> None:
    """One training step's LoRA gradients on `batch` are the same with the UNet's
    gradient checkpointing off and on, and with it on `block` runs again in backward
    (`train_mode`: the UNet put in train mode before each)."""

    def grads(checkpointing: bool) -> tuple[list[torch.Tensor], int]:
        (model.model.enable_gradient_checkpointing if checkpointing
         else model.model.disable_gradient_checkpointing)()
        if train_mode:
            model.model.train()
        calls = []
        hook = block.register_forward_pre_hook(lambda *a: calls.append(1))
        for p in net.trainable_parameters():
            p.grad = None
        compute_loss(model, batch, step_generator(1, 0, 0)).backward()
        hook.remove()
        return [p.grad.clone() for p in net.trainable_parameters()], len(calls)

    off, calls_off = grads(False)
    on, calls_on = grads(True)
    assert (calls_off, calls_on) == (1, 2)  # the block re-ran in backward
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(off, on, strict=True))


def assert_quantized_step_moves_only_the_lora(model: BaseModel, net: AdapterNetwork,
                                              batch: DataBatch) -> None:
    """One AdamW step on `batch` reaches every LoRA weight, and only LoRA weights of the
    (quantized) UNet require grad: the base's prediction stays, the adapted one moves."""

    def base_and_adapted() -> tuple[torch.Tensor, torch.Tensor]:
        net.disable()
        base = unet_prediction(model, batch)
        net.enable()
        return base, unet_prediction(model, batch)

    base, adapted = base_and_adapted()
    lora = net.trainable_parameters()
    optimizer = torch.optim.AdamW(lora, lr=1e-2)
    compute_loss(model, batch, step_generator(0, 0, 0)).backward()
    optimizer.step()
    assert all(p.grad is not None for p in lora)
    trainable = {n for n, p in model.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base_after, adapted_after = base_and_adapted()
    assert torch.equal(base_after, base)  # the quantized base did not move
    assert not torch.equal(adapted_after, adapted)


# ---- the real entry point -----------------------------------------------------------------
def assert_offline_run_is_one_line(config: Path, hf_home: Path, hub_id: str) -> None:
    """`python run.py <config>` in a child process, the model named by the uncached
    `hub_id`, HF_HUB_OFFLINE set: exit 2 with one `error:` line naming the id and
    HF_HUB_OFFLINE, no traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(config)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == EXIT_INPUT, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert hub_id in errors[0] and "HF_HUB_OFFLINE" in errors[0]
