"""The `sd1` and `sd2` archs on tiny random Stable Diffusion 1.x / 2.x models built
locally (the real ones' structure): load, prompt embeds equal to diffusers' pipeline's,
DDPM training (epsilon and v), Min-SNR, kohya LoRA files that ComfyUI maps and diffusers
loads to the same image, exact resume after a real SIGINT, gradient checkpointing,
quantization, upstream's derivation of the arch, and the offline hub error. The text
encoder's LoRA is in test_text_encoder_lora.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.errors import ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.registry import load_model
from aitk.models.stable_diffusion.model import SD1Model, SD2Model
from tests.aitk.aitk_testing import REPO, write_config
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    model_cfg,
    ran_in_process,
    randomise,
    tiny_model_folder,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    assert_lora_turns_the_render_into_the_preview,
    png_levels,
)
from tests.aitk.models.unet_checks import (
    arch_fixture,
    assert_checkpointing_reruns_the_block_with_the_same_gradients,
    assert_ddpm_target_and_every_lora_weight_trains,
    assert_kohya_file_reads_back_in_every_layout,
    assert_min_snr_weights_the_loss,
    assert_offline_run_is_one_line,
    assert_quantized_step_moves_only_the_lora,
    assert_sigint_mid_step_3_then_resume_matches,
    folder_fixture,
    prompt_levels,
    registry_model,
    stock_pipeline,
    unet_batch,
    unet_prediction,
)

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


arch = arch_fixture(CLASSES)
folder = folder_fixture()


# ---- load, encoders, conventions ----------------------------------------------------
def test_builds_and_loads_through_the_registry(arch: str, folder: Path) -> None:
    model = registry_model(arch, folder)
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
    model = registry_model(arch, folder)
    pipe = stock_pipeline(arch, folder)
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
    model = registry_model(arch, folder, is_v_pred=v_pred)
    v = (arch == "sd2") if v_pred is None else v_pred
    kind = "v_prediction" if v else "epsilon"
    assert model.training_schedule.prediction_type == kind
    assert model.noise_scheduler.config.prediction_type == kind
    net = AdapterNetwork.attach(model, NET)
    assert_ddpm_target_and_every_lora_weight_trains(model, net, unet_batch(model), v,
                                                    monkeypatch)


def test_min_snr_gamma_weights_the_loss(arch: str, folder: Path) -> None:
    model = registry_model(arch, folder)
    assert_min_snr_weights_the_loss(model, unet_batch(model), v_prediction=arch == "sd2")


# ---- LoRA files ---------------------------------------------------------------------
def test_lora_file_is_kohya_with_alpha_and_every_layout_reads_back(
        arch: str, folder: Path, tmp_path: Path) -> None:
    assert_kohya_file_reads_back_in_every_layout(
        lambda: registry_model(arch, folder), NET, tmp_path,
        "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q")


def test_every_key_is_one_comfyui_maps(arch: str, folder: Path, tmp_path: Path) -> None:
    """The file's modules are exactly the ComfyUI UNet weights of the table, each with
    the down/up/alpha triple ComfyUI's load_lora reads."""
    model = registry_model(arch, folder)
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
    model = registry_model(arch, folder)
    net = AdapterNetwork.attach(model, NetCfg(type="lokr", linear=4, linear_alpha=2))
    randomise(net, seed=0, scale=0.2)
    batch = unet_batch(model)
    trained = unet_prediction(model, batch)
    net.save_file(tmp_path / "lokr.safetensors")
    keys = set(load_file(tmp_path / "lokr.safetensors"))
    module = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    assert f"{module}.alpha" in keys and any(k.startswith(f"{module}.lokr_w") for k in keys)
    assert all(k.startswith("lora_unet_") for k in keys)
    fresh = registry_model(arch, folder)
    AdapterNetwork.attach(fresh, NetCfg(type="lokr", linear=4, linear_alpha=2)).load_file(
        tmp_path / "lokr.safetensors")
    assert torch.equal(unet_prediction(fresh, batch), trained)


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
    return arch, folder, ran_in_process(sd_job(root, arch, folder, "full"))


def test_sigint_mid_step_then_resume_gives_the_uninterrupted_lora(
        uninterrupted: tuple[str, Path, Path], tmp_path: Path, monkeypatch) -> None:
    arch, folder, straight = uninterrupted
    assert_sigint_mid_step_3_then_resume_matches(sd_job(tmp_path, arch, folder, "full"),
                                                 straight, monkeypatch)


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
    preview = png_levels(out / "samples" / f"{STEPS:09d}_0.png")
    pipe = stock_pipeline(arch, folder)
    assert_lora_turns_the_render_into_the_preview(pipe, out / "full.safetensors", preview,
                                                  lambda: prompt_levels(pipe, PROMPT))


def test_file_metadata_names_the_arch(uninterrupted: tuple[str, Path, Path]) -> None:
    arch, _, out = uninterrupted
    with safe_open(str(out / "full.safetensors"), "pt") as fh:
        meta = fh.metadata()
    assert meta["base_model_arch"] == arch and meta["network_alpha"] == f"{float(ALPHA)}"


# ---- memory features ----------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_gradients(arch: str, folder: Path) -> None:
    model = registry_model(arch, folder)
    net = AdapterNetwork.attach(model, NET)
    randomise(net, seed=0, scale=0.2)
    block = model.model.down_blocks[0].attentions[0].transformer_blocks[0]
    assert_checkpointing_reruns_the_block_with_the_same_gradients(
        model, net, unet_batch(model), block, train_mode=True)


def test_quantized_step_trains_only_lora(arch: str, folder: Path) -> None:
    from aitk.models.quantize import is_quantized

    model = registry_model(arch, folder, quantize=True, qtype="qint8", quantize_te=True,
                 qtype_te="qint8")
    assert is_quantized(model.model) and is_quantized(model.text_encoder)
    assert not is_quantized(model.model.time_embedding)
    net = AdapterNetwork.attach(model, NET)
    randomise(net, seed=0, scale=0.2)
    assert_quantized_step_moves_only_the_lora(model, net, unet_batch(model))


def test_preview_samples_through_the_pipeline(arch: str, folder: Path) -> None:
    model = registry_model(arch, folder)
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
    assert_offline_run_is_one_line(path, tmp_path / "hf", "someone/sd-not-cached")
