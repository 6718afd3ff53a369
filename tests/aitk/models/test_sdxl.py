"""The `sdxl` arch on a tiny random SDXL built locally (same structure as the real one):
load, DDPM training (epsilon and v), Min-SNR, time ids from the batch, LoRA files that
diffusers loads to the same image, exact resume after a real SIGINT, gradient
checkpointing, quantization, and the offline hub error."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.config.loading import load_config
from aitk.data.batches import BatchSource
from aitk.data.dataset import scan_folder
from aitk.errors import ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.registry import load_model
from aitk.models.sdxl.model import SDXLModel, batch_time_ids, time_ids
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import REPO, write_config, write_image
from tests.aitk.models.arch_checks import (
    model_cfg,
    ran_in_process,
    randomise,
    tiny_model_folder,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    assert_lora_turns_the_render_into_the_preview,
    png_levels,
    rounded_levels,
)
from tests.aitk.models.unet_checks import (
    assert_checkpointing_reruns_the_block_with_the_same_gradients,
    assert_ddpm_target_and_every_lora_weight_trains,
    assert_kohya_file_reads_back_in_every_layout,
    assert_min_snr_weights_the_loss,
    assert_offline_run_is_one_line,
    assert_quantized_step_moves_only_the_lora,
    assert_sigint_mid_step_3_then_resume_matches,
    registry_model,
    stock_pipeline,
    unet_batch,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

sdxl_cfg = partial(model_cfg, "sdxl")
NET = NetCfg(linear=4, linear_alpha=2.0)  # alpha != rank: files must carry it
sdxl_dir = tiny_model_folder(SDXLModel, scope="session")


def make(sdxl_dir: Path, **kw: Any) -> SDXLModel:
    return registry_model("sdxl", sdxl_dir, **kw)


def perturb(net: AdapterNetwork) -> None:
    """Non-zero LoRA up weights, as training would leave them."""
    randomise(net, seed=0, scale=0.2)




# ---- load, encoders, conventions ----------------------------------------------------
def test_the_scheduler_is_the_class_its_config_names(sdxl_dir: Path, tmp_path: Path) -> None:
    """A model folder that ships DDIM previews with DDIM (Euler is only the fallback for a
    config naming no diffusers scheduler); `is_v_pred` still overrides its target."""
    import json
    import shutil

    import diffusers

    folder = tmp_path / "ddim"
    shutil.copytree(sdxl_dir, folder)
    config = folder / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "_class_name": "DDIMScheduler"}))
    model = load_model(sdxl_cfg(folder, is_v_pred=True))
    assert type(model.noise_scheduler) is diffusers.DDIMScheduler
    assert model.noise_scheduler.config.prediction_type == "v_prediction"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "_class_name": "NoSuchScheduler"}))
    assert type(load_model(sdxl_cfg(folder)).noise_scheduler) is \
        diffusers.EulerDiscreteScheduler


def test_builds_and_loads_through_the_registry(sdxl_dir: Path) -> None:
    model = make(sdxl_dir)
    assert isinstance(model, SDXLModel) and model.unet is model.model
    assert (sdxl_dir / "tokenizer" / "tokenizer.json").is_file()
    assert not any(p.requires_grad for p in model.model.parameters())
    # VAE factor 2 (tiny) x two UNet down blocks; real SDXL: 8 x 4 = 32.
    assert model.get_bucket_divisibility() == 4
    assert model.vae.config.scaling_factor == 0.13025
    assert set(model.lora_block_prefixes) == {"down_blocks.1.attentions.",
                                              "mid_block.attentions.",
                                              "up_blocks.0.attentions."}
    embeds = model.get_prompt_embeds(["a cat", ""])
    assert [tuple(t.shape) for t in embeds.text_embeds] == [(77, 64)] * 2  # 32 + 32
    assert [tuple(t.shape) for t in embeds.pooled_embeds] == [(1, 32)] * 2
    pixels = torch.rand(1, 3, 16, 24) * 2 - 1
    assert model.encode_images(pixels).shape == (1, 4, 8, 12)
    assert torch.equal(model.encode_images(pixels), model.encode_images(pixels))


def test_missing_part_is_one_line_load_error(sdxl_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="neither a diffusers model folder"):
        load_model(sdxl_cfg(tmp_path / "nowhere"))
    (tmp_path / "partial" / "unet").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="lacks vae/"):
        load_model(sdxl_cfg(tmp_path / "partial"))
    # A weight variant the folder does not have: one line naming the folder.
    with pytest.raises(ModelLoadError, match="cannot load the SDXL model folder") as info:
        load_model(sdxl_cfg(sdxl_dir, model_kwargs={"variant": "fp16"}))
    assert "\n" not in str(info.value) and "fp16" in str(info.value)


def test_time_ids_follow_sdxl_order() -> None:
    assert time_ids((768, 1024), (12, 40), (512, 640)) == [768, 1024, 12, 40, 512, 640]
    plain = batch_time_ids(None, (64, 96), 2)
    assert plain.tolist() == [[64, 96, 0, 0, 64, 96]] * 2


def test_time_ids_from_a_non_square_image_carry_its_original_size(sdxl_dir: Path,
                                                                   tmp_path: Path) -> None:
    model = make(sdxl_dir)
    write_image(tmp_path / "wide.png", (90, 60), (200, 30, 30), "a wide red thing")
    items = scan_folder(tmp_path, resolutions=[24], divisibility=4, report=lambda m: None)
    source = BatchSource(items, 1, 0, None, model.encode_images, model.get_prompt_embeds)
    batch = source.next()
    # 90x60 scaled to fit 24^2 (29x19) -> bucket 28x16 (w x h); resize keeps the aspect
    # (28x19), centre crop from the top: (19 - 16) // 2 = 1.
    assert items[0].bucket == (28, 16)
    assert batch.original_sizes == [(60, 90)] and batch.crop_coords_top_left == [(1, 0)]
    seen = []
    hook = model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["added_cond_kwargs"]["time_ids"]),
        with_kwargs=True)
    compute_loss(model, batch, step_generator(0, 0, 0))
    hook.remove()
    assert seen[0].tolist() == [[60, 90, 1, 0, 16, 28]]


# ---- DDPM training ------------------------------------------------------------------
@pytest.mark.parametrize("v_pred", [False, True])
def test_ddpm_targets_in_a_real_training_step_and_lora_trains(sdxl_dir: Path, v_pred: bool,
                                                              monkeypatch) -> None:
    model = make(sdxl_dir, is_v_pred=v_pred)
    kind = "v_prediction" if v_pred else "epsilon"
    assert model.training_schedule.prediction_type == kind
    assert model.noise_scheduler.config.prediction_type == kind  # previews agree
    net = AdapterNetwork.attach(model, NET)
    assert_ddpm_target_and_every_lora_weight_trains(model, net, unet_batch(model), v_pred,
                                                    monkeypatch)


def test_min_snr_gamma_changes_the_loss(sdxl_dir: Path) -> None:
    model = make(sdxl_dir)
    assert_min_snr_weights_the_loss(model, unet_batch(model), v_prediction=False)


# ---- LoRA files ---------------------------------------------------------------------
def test_lora_file_is_kohya_with_alpha_and_every_layout_reads_back(sdxl_dir: Path,
                                                                   tmp_path: Path) -> None:
    assert_kohya_file_reads_back_in_every_layout(
        lambda: make(sdxl_dir), NET, tmp_path,
        "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q")


def test_foreign_lora_keys_are_clear_errors() -> None:
    from aitk.errors import AdapterKeyError
    from aitk.models.sdxl.lora_keys import from_files

    t = torch.zeros(4, 8)
    names = ["down_blocks.1.attentions.0.proj_in"]
    read = from_files({"lora_unet_down_blocks_1_attentions_0_proj_in.lora_down.weight": t},
                      names)
    assert set(read) == {"down_blocks.1.attentions.0.proj_in.lora_A.weight",
                         "down_blocks.1.attentions.0.proj_in.alpha"}
    assert float(read["down_blocks.1.attentions.0.proj_in.alpha"]) == 4.0  # = rank
    with pytest.raises(AdapterKeyError, match="text-encoder LoRA"):
        from_files({"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": t},
                   names)
    with pytest.raises(AdapterKeyError, match="names no layer of this UNet"):
        from_files({"lora_unet_input_blocks_4_1_proj_in.lora_down.weight": t}, names)


# ---- end to end: a real job, SIGINT, resume, interop ----------------------------------
STEPS = 4


def job(tmp: Path, sdxl_dir: Path, name: str, **train: Any) -> Path:
    cfg = {"job": "extension", "meta": {"name": "[name]"}, "config": {"name": name, "process": [{
        "type": "sd_trainer", "training_folder": str(tmp / "out"), "device": "cpu",
        "trigger_word": "p1xel",
        "network": {"type": "lora", "linear": 4, "linear_alpha": 2},
        "save": {"dtype": "float32", "save_every": 2, "max_step_saves_to_keep": 2},
        "datasets": [{"folder_path": str(REPO / "datasets" / "example"), "resolution": [16],
                      "caption_dropout_rate": 0.3}],
        "train": {"batch_size": 2, "steps": STEPS, "lr": 5e-2, "seed": 3,
                  "min_snr_gamma": 5.0, "noise_offset": 0.05,
                  "cache_text_embeddings": True, "skip_first_sample": True, **train},
        "model": {"arch": "sdxl", "name_or_path": str(sdxl_dir)},
        "sample": {"sample_every": STEPS, "width": 16, "height": 16, "sample_steps": 2,
                   "prompts": ["[trigger] a red circle"], "seed": 11,
                   "guidance_scale": 3.0, "format": "png"}}]}}
    return write_config(tmp / f"{name}.yml", cfg)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, sdxl_dir: Path) -> Path:
    return ran_in_process(job(tmp_path_factory.mktemp("sdxl-job"), sdxl_dir, "full"))


def test_sigint_mid_step_then_resume_gives_the_uninterrupted_lora(
        uninterrupted: Path, sdxl_dir: Path, tmp_path: Path, monkeypatch) -> None:
    assert_sigint_mid_step_3_then_resume_matches(job(tmp_path, sdxl_dir, "full"),
                                                 uninterrupted, monkeypatch)


def test_saved_lora_in_diffusers_gives_the_trainers_preview(uninterrupted: Path,
                                                            sdxl_dir: Path) -> None:
    """The job's own preview at the last step vs diffusers' StableDiffusionXLPipeline
    with load_lora_weights(file), same embeds and seed: equal to 1/255; without the
    LoRA the image differs."""
    preview = png_levels(uninterrupted / "samples" / f"{STEPS:09d}_0.png")
    embeds = make(sdxl_dir).get_prompt_embeds(["p1xel a red circle"])
    pipe = stock_pipeline("sdxl", sdxl_dir)

    def image() -> np.ndarray:
        out = pipe(prompt_embeds=embeds.text_embeds[0][None],
                   pooled_prompt_embeds=embeds.pooled_embeds[0],
                   negative_prompt_embeds=torch.zeros(1, 77, 64),
                   negative_pooled_prompt_embeds=torch.zeros(1, 32), width=16, height=16,
                   num_inference_steps=2, guidance_scale=3.0,
                   generator=torch.Generator().manual_seed(11), output_type="np").images[0]
        return rounded_levels(out)

    assert_lora_turns_the_render_into_the_preview(pipe, uninterrupted / "full.safetensors",
                                                  preview, image)


def test_file_metadata_names_the_arch(uninterrupted: Path) -> None:
    with safe_open(str(uninterrupted / "full.safetensors"), "pt") as fh:
        meta = fh.metadata()
    assert meta["base_model_arch"] == "sdxl" and meta["network_alpha"] == "2.0"


# ---- memory features ----------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_gradients(sdxl_dir: Path) -> None:
    model = make(sdxl_dir)
    net = AdapterNetwork.attach(model, NET)
    perturb(net)
    batch = unet_batch(model)
    # diffusers checkpoints each transformer block (and each resnet) of the UNet.
    block = model.model.down_blocks[1].attentions[0].transformer_blocks[0]
    assert_checkpointing_reruns_the_block_with_the_same_gradients(model, net, batch, block)


def test_quantized_step_trains_only_lora(sdxl_dir: Path) -> None:
    from aitk.models.quantize import is_quantized

    model = make(sdxl_dir, quantize=True, qtype="qint8", quantize_te=True, qtype_te="qint8")
    assert is_quantized(model.model) and is_quantized(model.text_encoder_2)
    assert not is_quantized(model.model.time_embedding)
    assert not is_quantized(model.text_encoder_2.text_projection)  # the pooled output
    net = AdapterNetwork.attach(model, NET)
    perturb(net)
    assert_quantized_step_moves_only_the_lora(model, net, unet_batch(model))


@pytest.mark.parametrize("low_vram", [False, True])
def test_low_vram_moves_idle_parts_only_for_their_use(sdxl_dir: Path, low_vram: bool,
                                                      monkeypatch) -> None:
    model = make(sdxl_dir, low_vram=low_vram)
    moves: list[str] = []
    real_to = torch.nn.Module.to

    def record(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if module is model.vae or module is model.text_encoder_2:
            moves.append(f"{type(module).__name__}->{torch.device(args[0]).type}")
        return real_to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", record)
    model.encode_images(torch.zeros(1, 3, 8, 8))
    model.get_prompt_embeds(["a"])
    # On this CPU the device is the CPU too: the order of the moves is what shows.
    expected = ["AutoencoderKL->cpu", "AutoencoderKL->cpu",
                "CLIPTextModelWithProjection->cpu", "CLIPTextModelWithProjection->cpu"]
    assert moves == (expected if low_vram else [])


def test_preview_samples_through_the_sdxl_pipeline(sdxl_dir: Path) -> None:
    model = make(sdxl_dir)
    [img] = model.generate_images([GenerateImageConfig(prompt="a cat", width=16, height=24,
                                                       sample_steps=2, seed=1)])
    assert img.size == (16, 24)


# ---- configs and the real entry point -------------------------------------------------
def test_tiny_example_config_trains_end_to_end(tmp_path: Path, sdxl_dir: Path,
                                               capsys) -> None:
    raw = yaml.safe_load((REPO / "config/examples/train_lora_sdxl_tiny_cpu.yaml").read_text())
    proc = raw["config"]["process"][0]
    assert proc["model"]["create_if_missing"] and proc["model"]["arch"] == "sdxl"
    proc["training_folder"] = str(tmp_path / "out")
    proc["model"]["name_or_path"] = str(tmp_path / "model")  # built by create_if_missing
    proc["datasets"][0]["folder_path"] = str(REPO / proc["datasets"][0]["folder_path"])
    assert cli_main([str(write_config(tmp_path / "tiny.yml", raw))]) == 0
    out = tmp_path / "out" / raw["config"]["name"]
    assert (out / f"{raw['config']['name']}.safetensors").is_file()
    assert (tmp_path / "model" / "model_index.json").is_file()


def test_24gb_example_config_is_valid_and_is_v_pred_is_read(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "config/examples/train_lora_sdxl_24gb.yaml").read_text())
    loaded = load_config(str(write_config(tmp_path / "a.yml", raw)))
    model = loaded.job.config.process[0].model
    assert model.arch == "sdxl" and "/" in model.name_or_path and not loaded.warnings
    assert model.is_v_pred is None  # the scheduler config decides
    raw["config"]["process"][0]["model"]["is_v_pred"] = True  # upstream's key, now read
    loaded = load_config(str(write_config(tmp_path / "b.yml", raw)))
    assert loaded.job.config.process[0].model.is_v_pred is True and not loaded.warnings


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, sdxl_dir: Path) -> None:
    cfg = yaml.safe_load(job(tmp_path, sdxl_dir, "hub").read_text())
    cfg["config"]["process"][0]["model"]["name_or_path"] = "someone/sdxl-not-cached"
    path = write_config(tmp_path / "hub.yml", cfg)
    assert_offline_run_is_one_line(path, tmp_path / "hf", "someone/sdxl-not-cached")


# ---- LoCon (network.conv) and DoRA ------------------------------------------------------
@dataclass
class ConvNet(NetCfg):
    conv: int | None = 3
    conv_alpha: float | None = 6.0


def unet_out(unet: torch.nn.Module) -> torch.Tensor:
    gen = torch.Generator().manual_seed(4)
    x, ctx = torch.randn(1, 4, 8, 8, generator=gen), torch.randn(1, 77, 64, generator=gen)
    cond = {"text_embeds": torch.randn(1, 32, generator=gen),
            "time_ids": torch.tensor([[64.0, 64, 0, 0, 64, 64]])}
    with torch.no_grad():
        return unet(x, torch.tensor([500]), encoder_hidden_states=ctx,
                    added_cond_kwargs=cond, return_dict=False)[0]


def test_locon_trains_the_unet_convs_in_kohyas_layout_and_diffusers_loads_it(
        sdxl_dir: Path, tmp_path: Path) -> None:
    from diffusers import StableDiffusionXLPipeline

    model = make(sdxl_dir)
    net = AdapterNetwork.attach(model, ConvNet(linear=4, linear_alpha=2.0))
    perturb(net)
    path = tmp_path / "locon.safetensors"
    net.save_file(path)
    sd = load_file(path)
    conv = "lora_unet_down_blocks_0_resnets_0_conv1"
    assert sd[f"{conv}.lora_down.weight"].shape[:2] == (3, 32)  # rank `conv`, 3x3
    assert sd[f"{conv}.lora_down.weight"].shape[2:] == (3, 3)
    assert float(sd[f"{conv}.alpha"]) == 6.0
    shortcut = "lora_unet_up_blocks_0_resnets_0_conv_shortcut"  # 1x1: the linear rank
    assert sd[f"{shortcut}.lora_down.weight"].shape[0] == 4
    assert float(sd[f"{shortcut}.alpha"]) == 2.0
    # ComfyUI maps `lora_unet_` + the diffusers module name with "_" onto every UNet
    # weight (comfy/lora.py model_lora_keys_unet): each module here is a real layer.
    names = {n.replace(".", "_") for n, _ in model.get_model_to_train().named_modules()}
    assert all(k.split(".")[0][len("lora_unet_"):] in names for k in sd)
    trained = unet_out(model.model)
    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_dir, add_watermarker=False)
    plain = unet_out(pipe.unet)
    pipe.load_lora_weights(str(path))
    assert torch.allclose(unet_out(pipe.unet), trained, atol=1e-5)
    assert not torch.allclose(plain, trained, atol=1e-3)
    fresh = make(sdxl_dir)
    AdapterNetwork.attach(fresh, ConvNet(linear=4, linear_alpha=2.0)).load_file(path)
    assert torch.equal(unet_out(fresh.model), trained)


def test_dora_saves_kohyas_dora_scale_and_reloads_exactly(sdxl_dir: Path,
                                                         tmp_path: Path) -> None:
    model = make(sdxl_dir)
    net = AdapterNetwork.attach(model, ConvNet(type="dora", linear=4, linear_alpha=2.0))
    perturb(net)
    path = tmp_path / "dora.safetensors"
    net.save_file(path)
    sd = load_file(path)
    attn = "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q"
    assert sd[f"{attn}.dora_scale"].shape == (64, 1)  # one value per output row
    assert sd["lora_unet_down_blocks_0_resnets_0_conv1.dora_scale"].shape == (32, 1, 1, 1)
    trained = unet_out(model.model)
    fresh = make(sdxl_dir)
    AdapterNetwork.attach(fresh, ConvNet(type="dora", linear=4, linear_alpha=2.0)
                          ).load_file(path)
    assert torch.equal(unet_out(fresh.model), trained)
    plain = make(sdxl_dir)
    assert not torch.allclose(unet_out(plain.model), trained, atol=1e-3)


def test_a_fresh_dora_or_locon_adapter_changes_nothing(sdxl_dir: Path) -> None:
    base = unet_out(make(sdxl_dir).model)
    for kind in ("lora", "dora"):
        model = make(sdxl_dir)
        AdapterNetwork.attach(model, ConvNet(type=kind))
        assert torch.allclose(unet_out(model.model), base, atol=1e-5), kind
