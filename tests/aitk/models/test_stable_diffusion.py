"""The `sd1` and `sd2` archs on tiny random Stable Diffusion 1.x / 2.x models built
locally (the real ones' structure): load, prompt embeds equal to diffusers' pipeline's,
DDPM training (epsilon and v), Min-SNR, kohya LoRA files that ComfyUI maps and diffusers
loads to the same image, exact resume after a real SIGINT, gradient checkpointing,
quantization, upstream's derivation of the arch, and the offline hub error. The text
encoder's LoRA is in test_text_encoder_lora.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.data.batch import DataBatch
from aitk.diffusion import losses as losses_module
from aitk.errors import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.registry import load_model
from aitk.models.stable_diffusion.model import SD1Model, SD2Model
from aitk.run import train as train_module
from aitk.run.job import run_job
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import REPO, write_config
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    model_cfg,
    randomise,
    tiny_model_folder,
    train_cfg,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg

# Trains and reloads tiny models: the per-arch tier (docs/testing.md).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

NET = NetCfg(linear=4, linear_alpha=2.0)  # alpha != rank: files must carry it
CLASSES = {"sd1": SD1Model, "sd2": SD2Model}
sd1_dir = tiny_model_folder(SD1Model, scope="session")
sd2_dir = tiny_model_folder(SD2Model, scope="session")
PROMPT = "p1xel a red circle"  # last_step_sample's prompt with the job's trigger

# ComfyUI's key map for the tiny UNet (comfy.utils.unet_to_diffusers over its LDM config:
# num_res_blocks [1, 1], channel_mult [1, 2], attention at the first level): each
# diffusers attention module -> ComfyUI's, and the Linear weights inside it that ComfyUI
# maps (its TRANSFORMER_BLOCKS; UNET_MAP_ATTENTIONS' proj_in/out, Linear in SD 2.x only).
COMFY_UNET_MODULES = {"down_blocks.0.attentions.0": "input_blocks.1.1",
                      "mid_block.attentions.0": "middle_block.1",
                      "up_blocks.1.attentions.0": "output_blocks.2.1",
                      "up_blocks.1.attentions.1": "output_blocks.3.1"}
COMFY_BLOCK_LINEARS = tuple(f"transformer_blocks.0.{layer}" for layer in (
    "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
    "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
    "ff.net.0.proj", "ff.net.2"))
COMFY_PROJECTIONS = ("proj_in", "proj_out")


def comfy_unet_table(arch: str) -> dict[str, str]:
    """kohya module name -> the ComfyUI UNet weight it patches."""
    layers = COMFY_BLOCK_LINEARS + (COMFY_PROJECTIONS if arch == "sd2" else ())
    return {"lora_unet_" + f"{ours}.{layer}".replace(".", "_"):
            f"diffusion_model.{theirs}.{layer}.weight"
            for ours, theirs in COMFY_UNET_MODULES.items() for layer in layers}


@pytest.fixture(params=sorted(CLASSES))
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def folder(arch: str, request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{arch}_dir")


def make(arch: str, folder: Path, **kw: Any) -> SD1Model:
    model = load_model(model_cfg(arch, folder, **kw))
    model.configure_training(train_cfg())
    return model


def batch_of(model: SD1Model) -> DataBatch:
    gen = torch.Generator().manual_seed(1)
    captions = ["a red circle", "a green square"]
    return DataBatch(captions=captions, latents=torch.randn(2, 4, 8, 12, generator=gen),
                     prompt_embeds=model.get_prompt_embeds(captions))


def predict(model: SD1Model, batch: DataBatch) -> torch.Tensor:
    with torch.no_grad():
        return model.get_noise_prediction(batch.latents, torch.tensor([100.0, 700.0]),
                                          batch.prompt_embeds)


def sd_pipeline(folder: Path) -> Any:
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None,
                                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- load, encoders, conventions ----------------------------------------------------
def test_builds_and_loads_through_the_registry(arch: str, folder: Path) -> None:
    model = make(arch, folder)
    assert type(model) is CLASSES[arch] and model.unet is model.model
    assert not any(p.requires_grad for p in model.model.parameters())
    # VAE factor 2 (tiny) x two UNet levels; real SD: 8 x 8 = 64.
    assert model.get_bucket_divisibility() == 4
    assert model.vae.config.scaling_factor == 0.18215
    assert set(model.lora_block_prefixes) == {"down_blocks.0.attentions.",
                                              "mid_block.attentions.",
                                              "up_blocks.1.attentions."}
    assert model.model.config.use_linear_projection == (arch == "sd2")
    assert model.training_schedule.prediction_type == (
        "v_prediction" if arch == "sd2" else "epsilon")  # as the 768-v / 1.5 configs say
    embeds = model.get_prompt_embeds(["a cat", ""])
    assert [tuple(t.shape) for t in embeds.text_embeds] == [(77, 32)] * 2
    pixels = torch.rand(1, 3, 16, 24) * 2 - 1
    assert model.encode_images(pixels).shape == (1, 4, 8, 12)
    assert torch.equal(model.encode_images(pixels), model.encode_images(pixels))


def test_sd15_is_sd1(sd1_dir: Path) -> None:
    assert type(load_model(model_cfg("sd15", sd1_dir))) is SD1Model


def test_prompt_embeds_are_the_pipelines(arch: str, folder: Path) -> None:
    """What the StableDiffusionPipeline feeds its UNet for a prompt (and the empty
    negative) is what the trainer trains on."""
    model = make(arch, folder)
    pipe = sd_pipeline(folder)
    prompts = ["a red circle on blue", "x " * 100]  # the second one is truncated at 77
    with torch.no_grad():
        theirs = [pipe.encode_prompt(p, "cpu", 1, False)[0][0] for p in prompts]
    ours = model.get_prompt_embeds(prompts).text_embeds
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_missing_part_is_one_line_load_error(arch: str, folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="neither a diffusers model folder"):
        load_model(model_cfg(arch, tmp_path / "nowhere"))
    (tmp_path / "partial" / "unet").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="lacks vae/, text_encoder/"):
        load_model(model_cfg(arch, tmp_path / "partial"))
    with pytest.raises(ModelLoadError, match=r"cannot load the SD [12]\.x model") as info:
        load_model(model_cfg(arch, folder, model_kwargs={"variant": "fp16"}))
    assert "\n" not in str(info.value) and "fp16" in str(info.value)


# ---- DDPM training ------------------------------------------------------------------
@pytest.mark.parametrize("v_pred", [None, True, False])
def test_ddpm_targets_in_a_real_training_step_and_lora_trains(
        arch: str, folder: Path, v_pred: bool | None, monkeypatch) -> None:
    """The scheduler config's prediction type (or `is_v_pred`'s) is the training
    target and the previews' sampler's; a step on it trains every LoRA module."""
    model = make(arch, folder, is_v_pred=v_pred)
    v = (arch == "sd2") if v_pred is None else v_pred
    kind = "v_prediction" if v else "epsilon"
    assert model.training_schedule.prediction_type == kind
    assert model.noise_scheduler.config.prediction_type == kind
    net = AdapterNetwork.attach(model, NET)
    batch = batch_of(model)
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
    expected = noise if not v else abar.sqrt() * noise - (1 - abar).sqrt() * clean
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


def test_min_snr_gamma_weights_the_loss(arch: str, folder: Path) -> None:
    model = make(arch, folder)
    batch = batch_of(model)
    with torch.no_grad():
        plain = compute_loss(model, batch, step_generator(5, 0, 0))
        model.configure_training(train_cfg(min_snr_gamma=1.0))
        weighted = compute_loss(model, batch, step_generator(5, 0, 0))
    t = torch.tensor([10.0, 500.0])
    snr = model.training_schedule.snr(t)
    denominator = snr + 1 if arch == "sd2" else snr  # Min-SNR's v-prediction form
    assert torch.allclose(model.training_schedule.loss_weights(t),
                          torch.clamp(snr, max=1.0) / denominator)
    assert not torch.isclose(plain, weighted)


# ---- LoRA files ---------------------------------------------------------------------
def test_lora_file_is_kohya_with_alpha_and_every_layout_reads_back(
        arch: str, folder: Path, tmp_path: Path) -> None:
    model = make(arch, folder)
    net = AdapterNetwork.attach(model, NET)
    randomise(net, seed=0, scale=0.2)
    batch = batch_of(model)
    trained = predict(model, batch)
    path = tmp_path / "lora.safetensors"
    net.save_file(path)
    sd = load_file(path)
    module = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    assert {f"{module}.lora_down.weight", f"{module}.lora_up.weight", f"{module}.alpha"} \
        <= set(sd)
    assert all(k.startswith("lora_unet_") for k in sd) and float(sd[f"{module}.alpha"]) == 2

    def reloaded(file: Path) -> torch.Tensor:
        fresh = make(arch, folder)
        AdapterNetwork.attach(fresh, NET).load_file(file)
        return predict(fresh, batch)

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


def test_every_key_is_one_comfyui_maps(arch: str, folder: Path, tmp_path: Path) -> None:
    """The file's modules are exactly the ComfyUI UNet weights of the table, each with
    the down/up/alpha triple ComfyUI's load_lora reads."""
    model = make(arch, folder)
    AdapterNetwork.attach(model, NET).save_file(tmp_path / "lora.safetensors")
    keys = set(load_file(tmp_path / "lora.safetensors"))
    table = comfy_unet_table(arch)
    assert {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
            for k in keys} == set(table)
    assert keys == {f"{m}{s}" for m in table
                    for s in (".lora_down.weight", ".lora_up.weight", ".alpha")}
    # Spot checks against the real SD 1.5 map, which the tiny table follows.
    assert table["lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k"] == \
        "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"
    assert table["lora_unet_mid_block_attentions_0_transformer_blocks_0_ff_net_2"] == \
        "diffusion_model.middle_block.1.transformer_blocks.0.ff.net.2.weight"


def test_a_lokr_file_keeps_the_lycoris_names_and_reads_back(arch: str, folder: Path,
                                                           tmp_path: Path) -> None:
    model = make(arch, folder)
    net = AdapterNetwork.attach(model, NetCfg(type="lokr", linear=4, linear_alpha=2))
    randomise(net, seed=0, scale=0.2)
    batch = batch_of(model)
    trained = predict(model, batch)
    net.save_file(tmp_path / "lokr.safetensors")
    keys = set(load_file(tmp_path / "lokr.safetensors"))
    module = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    assert f"{module}.alpha" in keys and any(k.startswith(f"{module}.lokr_w") for k in keys)
    assert all(k.startswith("lora_unet_") for k in keys)
    fresh = make(arch, folder)
    AdapterNetwork.attach(fresh, NetCfg(type="lokr", linear=4, linear_alpha=2)).load_file(
        tmp_path / "lokr.safetensors")
    assert torch.equal(predict(fresh, batch), trained)


# ---- end to end: a real job, SIGINT, resume, interop ----------------------------------
def sd_job(root: Path, arch: str, folder: Path, name: str) -> Path:
    return write_lora_job(root, name, arch, folder, train={
        "batch_size": 2, "steps": STEPS, "lr": 5e-2, "seed": 3, "min_snr_gamma": 5.0,
        "noise_offset": 0.05, "noise_scheduler": "ddpm", "cache_text_embeddings": True,
        "skip_first_sample": True})


@pytest.fixture(scope="module", params=sorted(CLASSES))
def uninterrupted(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    arch = request.param
    folder = request.getfixturevalue(f"{arch}_dir")
    root = tmp_path_factory.mktemp(f"{arch}-job")
    assert run_job(load_config(str(sd_job(root, arch, folder, "full")))) == EXIT_OK
    return arch, folder, root / "out" / "full"


def test_sigint_mid_step_then_resume_gives_the_uninterrupted_lora(
        uninterrupted: tuple[str, Path, Path], tmp_path: Path, monkeypatch) -> None:
    arch, folder, straight = uninterrupted
    real = train_module.compute_loss
    calls = []

    def interrupting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:  # mid step 3: the real handler sets the stop flag
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    path = sd_job(tmp_path, arch, folder, "full")
    monkeypatch.setattr(train_module, "compute_loss", interrupting)
    assert run_job(load_config(str(path))) == EXIT_INTERRUPTED
    out = tmp_path / "out" / "full"
    assert (out / "checkpoints" / "step_000000003").is_dir()
    monkeypatch.setattr(train_module, "compute_loss", real)
    assert run_job(load_config(str(path))) == EXIT_OK
    resumed, full = load_file(out / "full.safetensors"), load_file(straight / "full.safetensors")
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_saved_lora_in_diffusers_gives_the_trainers_preview(
        uninterrupted: tuple[str, Path, Path]) -> None:
    """The job's preview at the last step vs diffusers' StableDiffusionPipeline, given
    the prompt's text, after load_lora_weights(file), same seed: equal to 1/255; without
    the LoRA the image differs."""
    arch, folder, out = uninterrupted
    weights = load_file(out / "full.safetensors")
    ups = [v for k, v in weights.items() if k.endswith(".lora_up.weight")]
    assert ups and any(v.abs().max() > 0 for v in ups)  # trained: up left its zero init
    assert all(float(v) == ALPHA for k, v in weights.items() if k.endswith(".alpha"))
    preview = np.asarray(Image.open(out / "samples" / f"{STEPS:09d}_0.png"), dtype=np.int16)
    pipe = sd_pipeline(folder)

    def image() -> np.ndarray:
        got = pipe(prompt=PROMPT, width=32, height=32, num_inference_steps=2,
                   guidance_scale=4.0, generator=torch.Generator().manual_seed(1),
                   output_type="np").images[0]
        return np.round(got * 255).astype(np.int16)

    plain = image()
    pipe.load_lora_weights(str(out / "full.safetensors"))
    assert np.abs(image() - preview).max() <= 1
    assert np.abs(plain - preview).max() > 2


def test_file_metadata_names_the_arch(uninterrupted: tuple[str, Path, Path]) -> None:
    arch, _, out = uninterrupted
    with safe_open(str(out / "full.safetensors"), "pt") as fh:
        meta = fh.metadata()
    assert meta["base_model_arch"] == arch and meta["network_alpha"] == f"{float(ALPHA)}"


# ---- memory features ----------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_gradients(arch: str, folder: Path) -> None:
    model = make(arch, folder)
    net = AdapterNetwork.attach(model, NET)
    randomise(net, seed=0, scale=0.2)
    batch = batch_of(model)
    block = model.model.down_blocks[0].attentions[0].transformer_blocks[0]

    def grads(checkpointing: bool) -> tuple[list[torch.Tensor], int]:
        (model.model.enable_gradient_checkpointing if checkpointing
         else model.model.disable_gradient_checkpointing)()
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


def test_quantized_step_trains_only_lora(arch: str, folder: Path) -> None:
    from aitk.models.quantize import is_quantized

    model = make(arch, folder, quantize=True, qtype="qint8", quantize_te=True,
                 qtype_te="qint8")
    assert is_quantized(model.model) and is_quantized(model.text_encoder)
    assert not is_quantized(model.model.time_embedding)
    net = AdapterNetwork.attach(model, NET)
    randomise(net, seed=0, scale=0.2)
    batch = batch_of(model)

    def base_and_adapted() -> tuple[torch.Tensor, torch.Tensor]:
        net.disable()
        base = predict(model, batch)
        net.enable()
        return base, predict(model, batch)

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


def test_preview_samples_through_the_pipeline(arch: str, folder: Path) -> None:
    model = make(arch, folder)
    [img] = model.generate_images([GenerateImageConfig(prompt="a cat", width=16, height=24,
                                                       sample_steps=2, seed=1)])
    assert img.size == (16, 24)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        model.generate_images([GenerateImageConfig(prompt="a", width=18, height=16)])


# ---- configs and the real entry point -------------------------------------------------
def _upstream_model(tmp_path: Path, name: str, model: dict[str, Any]) -> Any:
    raw = yaml.safe_load((REPO / "config/examples/train_lora_sd1_24gb.yaml").read_text())
    proc = raw["config"]["process"][0]
    proc["model"] = {"name_or_path": "someone/model", **model}
    return load_config(str(write_config(tmp_path / f"{name}.yml", raw)))


def test_upstreams_flags_derive_the_arch(tmp_path: Path) -> None:
    """No `is_*` flag is SD 1.x (upstream's default), `is_v2` is SD 2.x, `sd15` is sd1;
    `is_v_pred` is read for both."""
    cases = {"none": ({}, "sd1"), "v2": ({"is_v2": True, "is_v_pred": True}, "sd2"),
             "alias": ({"arch": "sd15"}, "sd1")}
    for name, (model, arch) in cases.items():
        loaded = _upstream_model(tmp_path, name, model)
        assert loaded.job.config.process[0].model.arch == arch and not loaded.warnings
    v2 = _upstream_model(tmp_path, "v2", cases["v2"][0]).job.config.process[0].model
    assert v2.is_v_pred is True


def test_24gb_example_config_is_valid(arch: str) -> None:
    loaded = load_config(str(REPO / f"config/examples/train_lora_{arch}_24gb.yaml"))
    proc = loaded.job.config.process[0]
    assert proc.model.arch == arch and "/" in proc.model.name_or_path and not loaded.warnings
    assert proc.train.noise_scheduler == "ddpm" and proc.model.is_v_pred is None


@pytest.mark.slow
def test_hub_id_offline_is_one_line_exit_2(arch: str, folder: Path, tmp_path: Path) -> None:
    path = sd_job(tmp_path, arch, folder, "hub")
    cfg = yaml.safe_load(path.read_text())
    cfg["config"]["process"][0]["model"]["name_or_path"] = "someone/sd-not-cached"
    write_config(path, cfg)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == EXIT_INPUT, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "someone/sd-not-cached" in errors[0] and "HF_HUB_OFFLINE" in errors[0]
