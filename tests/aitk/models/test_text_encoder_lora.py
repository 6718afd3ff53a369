"""Text-encoder LoRA (`train.train_text_encoder`) for sd1, sd2 and sdxl on their tiny
random models: the adapter goes on every CLIP encoder layer's Linear layers beside the
UNet's, trains with it (at `text_encoder_lr`) on live embeddings, resumes exactly, and
is saved in kohya's text-encoder names, which ComfyUI maps (the table below) and
diffusers' load_lora_weights applies to give the trainer's own preview. Caching text
embeddings with it is one config error; an arch without it refuses in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as run_main
from aitk.config.loading import load_config
from aitk.data.batch import DataBatch
from aitk.errors import AdapterError, AdapterKeyError
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.kohya import clip_name
from aitk.models.registry import load_model
from aitk.models.sdxl.model import SDXLModel
from aitk.models.stable_diffusion.model import SD1Model, SD2Model
from aitk.run.assembly import create_network, parameter_groups
from aitk.run.optim import build_optimizer, set_lr
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import write_config
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_same_weights,
    interrupt_via_stop_flag_then_resume,
    lora_job_config,
    model_cfg,
    ran_in_process,
    randomise,
    tiny_model_folder,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    png_levels,
)
from tests.aitk.models.unet_checks import (
    arch_fixture,
    folder_fixture,
    prompt_levels,
    registry_model,
    stock_pipeline,
    unet_batch,
)

# Trains and reloads tiny models: the per-arch tier (docs/testing.md).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

CLASSES: dict[str, type[BaseModel]] = {"sd1": SD1Model, "sd2": SD2Model, "sdxl": SDXLModel}
sd1_dir = tiny_model_folder(SD1Model, scope="session")
sd2_dir = tiny_model_folder(SD2Model, scope="session")
sdxl_dir = tiny_model_folder(SDXLModel, scope="session")
NET = NetCfg(linear=4, linear_alpha=2.0, train_text_encoder=True)
PROMPT = "p1xel a red circle"  # last_step_sample's prompt with the job's trigger
TEXT_LAYERS = 2  # the tiny encoders' layers

# Each text encoder's kohya prefix and the CLIP model ComfyUI patches with it
# (comfy.lora.model_lora_keys_clip: lora_te_ is SD 1.x's clip_l and SD 2.x's clip_h; with
# both clip_l and clip_g present, SDXL's, lora_te1_ and lora_te2_).
ENCODERS = {"sd1": {"text_encoder": ("lora_te_", "clip_l")},
            "sd2": {"text_encoder": ("lora_te_", "clip_h")},
            "sdxl": {"text_encoder": ("lora_te1_", "clip_l"),
                     "text_encoder_2": ("lora_te2_", "clip_g")}}
# ComfyUI's LORA_CLIP_MAP: each encoder layer's Linear -> its part of the kohya name.
LORA_CLIP_MAP = {"mlp.fc1": "mlp_fc1", "mlp.fc2": "mlp_fc2",
                 "self_attn.k_proj": "self_attn_k_proj", "self_attn.q_proj": "self_attn_q_proj",
                 "self_attn.v_proj": "self_attn_v_proj",
                 "self_attn.out_proj": "self_attn_out_proj"}


def comfy_clip_table(arch: str) -> dict[str, str]:
    """kohya text-encoder module name -> the ComfyUI CLIP weight it patches."""
    return {f"{prefix}text_model_encoder_layers_{b}_{kohya}":
            f"{clip}.transformer.text_model.encoder.layers.{b}.{layer}.weight"
            for prefix, clip in ENCODERS[arch].values() for b in range(TEXT_LAYERS)
            for layer, kohya in LORA_CLIP_MAP.items()}


def unread(arch: str, part: str, path: str) -> bool:
    """Whether a text-encoder layer feeds nothing the UNet sees: SDXL reads both
    encoders' penultimate states, so encoder 1's last layer is unused (encoder 2's feeds
    its pooled projection). Its LoRA is still there, as kohya and upstream make it."""
    return arch == "sdxl" and part == "text_encoder" and \
        f"layers.{TEXT_LAYERS - 1}." in path.replace("_", ".")


def module_names(keys: set[str]) -> set[str]:
    return {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
            for k in keys}


arch = arch_fixture(CLASSES)
folder = folder_fixture()


def live_batch(model: BaseModel) -> DataBatch:
    """A batch embedded as the trainer does while a text encoder trains: live."""
    return unet_batch(model)


# ---- the adapter on the encoders ------------------------------------------------------
def test_every_clip_layer_linear_trains_with_the_unet(arch: str, folder: Path) -> None:
    model = registry_model(arch, folder)
    net = AdapterNetwork.attach(model, NET)
    parts = model.text_encoder_parts()
    assert list(parts) == list(ENCODERS[arch]) and model.text_encoder_trains
    for encoder in parts.values():
        wrapped = [n for n, m in encoder.named_modules() if hasattr(m, "lora_A")]
        assert len(wrapped) == TEXT_LAYERS * len(LORA_CLIP_MAP)
        trainable = [n for n, p in encoder.named_parameters() if p.requires_grad]
        assert trainable and all(".lora_" in n for n in trainable)
    te_params = net.text_encoder_parameters()
    assert te_params and {id(p) for p in te_params} < {id(p) for p in
                                                       net.trainable_parameters()}
    batch = live_batch(model)
    assert batch.prompt_embeds.text_embeds[0].requires_grad  # live, with the graph
    before = {id(p): p.detach().clone() for p in te_params}
    optimizer = torch.optim.AdamW(net.trainable_parameters(), lr=1e-2)
    compute_loss(model, batch, step_generator(0, 0, 0)).backward()
    optimizer.step()
    for name, encoder in parts.items():
        for path, p in encoder.named_parameters():
            if p.requires_grad:
                dead = unread(arch, name, path)
                assert (p.grad is None) == dead, (name, path)
                assert torch.equal(before[id(p)], p) == dead, (name, path)


def test_file_keys_are_the_layout_comfyui_maps_and_read_back(arch: str, folder: Path,
                                                             tmp_path: Path) -> None:
    model = registry_model(arch, folder)
    net = AdapterNetwork.attach(model, NET)
    randomise(net, seed=2, scale=0.2)
    path = tmp_path / "lora.safetensors"
    net.save_file(path)
    keys = set(load_file(path))
    table = comfy_clip_table(arch)
    te_keys = {k for k in keys if not k.startswith("lora_unet_")}
    assert module_names(te_keys) == set(table)
    assert te_keys == {f"{m}{s}" for m in table
                       for s in (".lora_down.weight", ".lora_up.weight", ".alpha")}
    [(prefix, clip)] = list(ENCODERS[arch].values())[:1]
    assert table[f"{prefix}text_model_encoder_layers_1_self_attn_out_proj"] == \
        f"{clip}.transformer.text_model.encoder.layers.1.self_attn.out_proj.weight"

    saved = net.state_dict()
    fresh = AdapterNetwork.attach(registry_model(arch, folder), NET)
    fresh.load_file(path)
    assert all(torch.equal(v, saved[k]) for k, v in fresh.state_dict().items())
    # diffusers' own layout: `text_encoder.` + transformers 4's CLIP names, lora_A/B.
    diffusers_names = {}
    for key, value in saved.items():
        part, _, rest = key.partition(".")
        diffusers_names[f"{part}.{clip_name(rest)}" if part in ENCODERS[arch]
                        else f"unet.{key}"] = value
    save_file(diffusers_names, tmp_path / "diffusers.safetensors")
    fresh.load_file(tmp_path / "diffusers.safetensors")
    scale = 2.0 / 4.0  # no alpha keys: alpha = rank, so the saved B reads 2x larger
    assert all(torch.allclose(v, saved[k] * (1 / scale if ".lora_B." in k else 1))
               for k, v in fresh.state_dict().items())
    # A network that trains no text encoder refuses the file, naming why.
    unet_only = AdapterNetwork.attach(registry_model(arch, folder),
                                      NetCfg(linear=4, linear_alpha=2))
    with pytest.raises(AdapterKeyError, match="text-encoder LoRA, and this run trains no"):
        unet_only.load_file(path)


def test_text_encoder_lr_is_its_groups_rate_on_the_one_schedule(sd1_dir: Path,
                                                               tmp_path: Path) -> None:
    def groups(**train: Any) -> list[dict[str, Any]]:
        raw = lora_job_config(tmp_path, "lr", "sd1", sd1_dir, train={
            "lr": 1e-3, "train_text_encoder": True, "cache_text_embeddings": False,
            **train})
        proc = load_config(str(write_config(tmp_path / "lr.yml", raw))).job.config.process[0]
        model = registry_model("sd1", sd1_dir)
        net = create_network(model, proc)
        found = parameter_groups(net, proc)
        assert {id(p) for p in found[1]["params"]} == {id(p) for p in
                                                       net.text_encoder_parameters()}
        assert len(found[0]["params"]) + len(found[1]["params"]) == len(
            net.trainable_parameters())
        return found

    found = groups(text_encoder_lr=2.5e-4)
    assert found[1]["lr_scale"] == pytest.approx(0.25) and "lr_scale" not in found[0]
    optimizer = build_optimizer("adamw", found, 1e-3, {"weight_decay": 0.0})
    set_lr(optimizer, 4e-4)  # what the loop does at each step (a warmup, a decay)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([4e-4, 1e-4])
    assert groups()[1]["lr_scale"] == 1.0  # unset: lr
    # unet_lr: the denoiser's adapter at its own rate, the text encoder's kept
    both = build_optimizer("adamw", groups(unet_lr=5e-4, text_encoder_lr=2.5e-4), 1e-3,
                           {"weight_decay": 0.0})
    assert [g["lr"] for g in both.param_groups] == pytest.approx([5e-4, 2.5e-4])
    set_lr(both, 4e-4)
    assert [g["lr"] for g in both.param_groups] == pytest.approx([2e-4, 1e-4])


def test_low_vram_keeps_a_training_text_encoder_on_the_device(sd1_dir: Path,
                                                             monkeypatch) -> None:
    """An encoder that trains is not sent back to the CPU after embedding (its LoRA's
    gradients are computed later, on the device); before it trains it visits."""
    model = registry_model("sd1", sd1_dir, low_vram=True)
    moves: list[str] = []
    real_to = torch.nn.Module.to

    def record(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if module is model.text_encoder:
            moves.append(str(args[0]))
        return real_to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", record)
    model.get_prompt_embeds(["a"])
    assert moves == ["cpu", "cpu"]  # there and back (this device is the CPU too)
    AdapterNetwork.attach(model, NET)
    moves.clear()
    model.get_prompt_embeds(["a"])
    assert moves == []


# ---- end to end: a real job, the preview in diffusers, resume --------------------------
def te_job(root: Path, arch: str, folder: Path, name: str) -> Path:
    return write_lora_job(root, name, arch, folder, train={
        "batch_size": 2, "steps": STEPS, "lr": 5e-2, "text_encoder_lr": 2.5e-2, "seed": 3,
        "train_text_encoder": True, "cache_text_embeddings": False,
        "noise_scheduler": "ddpm", "min_snr_gamma": 5.0, "skip_first_sample": True})


@pytest.fixture(scope="module", params=sorted(CLASSES))
def te_run(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    arch = request.param
    folder = request.getfixturevalue(f"{arch}_dir")
    root = tmp_path_factory.mktemp(f"{arch}-te-job")
    return arch, folder, ran_in_process(te_job(root, arch, folder, "te"))


def pipeline_image(arch: str, folder: Path, lora: Path | None) -> np.ndarray:
    """diffusers' own pipeline for the arch, from the folder and the prompt's text (its
    own text encoders), after load_lora_weights(lora): the job's preview settings."""
    pipe = stock_pipeline(arch, folder)
    if lora is not None:
        pipe.load_lora_weights(str(lora))
    return prompt_levels(pipe, PROMPT)


def test_the_job_trains_both_and_saves_their_keys(te_run: tuple[str, Path, Path]) -> None:
    arch, _, out = te_run
    weights = load_file(out / "te.safetensors")
    for part, (prefix, _) in ENCODERS[arch].items():
        ups = {k: v for k, v in weights.items()
               if k.startswith(prefix) and k.endswith(".lora_up.weight")}
        assert len(ups) == TEXT_LAYERS * len(LORA_CLIP_MAP)
        for key, up in ups.items():  # every layer read learned
            assert bool(up.abs().max() > 0) != unread(arch, part, key), key
    assert any(k.startswith("lora_unet_") for k in weights)
    with safe_open(str(out / "te.safetensors"), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == arch


def test_diffusers_load_lora_weights_gives_the_trainers_preview(
        te_run: tuple[str, Path, Path], tmp_path: Path) -> None:
    """The job's preview equals diffusers' image from the file (to 1/255). With the up
    weights amplified (four tiny steps move the text encoders little), the trainer's
    preview of that file and diffusers' still agree, and dropping the text-encoder keys
    from it visibly changes diffusers' image: they are what it applied."""
    arch, folder, out = te_run
    lora = out / "te.safetensors"
    preview = png_levels(out / "samples" / f"{STEPS:09d}_0.png")
    assert np.abs(pipeline_image(arch, folder, lora) - preview).max() <= 1

    strong = amplified(lora, tmp_path / "strong.safetensors")
    model = registry_model(arch, folder)
    AdapterNetwork.attach(model, NET).load_file(strong)
    [ours] = model.generate_images([GenerateImageConfig(
        prompt=PROMPT, width=32, height=32, seed=1, guidance_scale=4.0, sample_steps=2)])
    ours = np.asarray(ours, dtype=np.int16)
    theirs = pipeline_image(arch, folder, strong)
    assert np.abs(theirs - ours).max() <= 1
    unet_only = tmp_path / "unet_only.safetensors"
    with safe_open(str(strong), "pt") as fh:
        meta = fh.metadata()
    save_file({k: v for k, v in load_file(strong).items() if k.startswith("lora_unet_")},
              str(unet_only), metadata=meta)
    assert np.abs(pipeline_image(arch, folder, unet_only) - theirs).max() > 4


@pytest.mark.parametrize("te_run", ["sd1"], indirect=True)
def test_ctrl_c_then_resume_ends_on_the_uninterrupted_weights(
        te_run: tuple[str, Path, Path], tmp_path: Path, monkeypatch) -> None:
    arch, folder, straight = te_run
    config = te_job(tmp_path, arch, folder, "te")
    interrupt_via_stop_flag_then_resume(
        config, tmp_path / "out" / "te" / "checkpoints" / "step_000000002", monkeypatch)
    assert_same_weights(tmp_path / "out" / "te" / "te.safetensors",
                        straight / "te.safetensors")


# ---- configs: what refuses it ---------------------------------------------------------
def test_caching_text_embeddings_with_it_is_one_config_error(sd1_dir: Path, tmp_path: Path,
                                                             capsys) -> None:
    for where in ("train.cache_text_embeddings", "train.unload_text_encoder",
                  "datasets[0].cache_text_embeddings"):
        raw = lora_job_config(tmp_path, "cached", "sd1", sd1_dir, train={
            "train_text_encoder": True, "cache_text_embeddings": False})
        proc = raw["config"]["process"][0]
        section, key = where.split(".")
        target = proc["datasets"][0] if section.startswith("datasets") else proc["train"]
        target[key] = True
        path = write_config(tmp_path / "cached.yml", raw)
        assert run_main([str(path), "--check"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert "train.train_text_encoder embeds every caption live" in lines[0]
        assert f"turn off {where}" in lines[0]


def test_an_arch_without_it_refuses_in_one_line(example_dir: Path, tmp_path: Path,
                                                capsys) -> None:
    raw = lora_job_config(tmp_path, "ex", "example", example_dir,
                          train={"train_text_encoder": True,
                                 "cache_text_embeddings": False})
    path = write_config(tmp_path / "ex.yml", raw)
    assert run_main([str(path), "--check"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "train.train_text_encoder" in lines[0]
    assert "arch example trains its denoiser only" in lines[0]
    # An arch the preflight cannot read (an extension's) refuses when the adapter attaches.
    model = load_model(model_cfg("example", example_dir))
    with pytest.raises(AdapterError, match="trains its denoiser only"):
        AdapterNetwork.attach(model, NET)
