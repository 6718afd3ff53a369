"""The `prx_pixel` arch on a tiny random model built locally: load, train with LoRA
(x-prediction: the target is the clean image), preview, Ctrl+C and exact resume, and
interop through peft (diffusers has no LoRA loader for PRX): the saved adapter loaded
with `PeftModel.from_pretrained` onto diffusers' PRXTransformer2DModel, in diffusers'
PRXPixelPipeline, gives the trainer's own preview."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.models.base import GenerateImageConfig
from aitk.models.prx_pixel.model import PRXPixelModel, run_pipeline
from aitk.models.prx_pixel.peft_adapter import convert_file
from aitk.models.prx_pixel.peft_adapter import main as peft_main
from aitk.models.registry import load_model
from aitk.run.train import compute_loss, step_generator
from tests.aitk.models.arch_checks import (
    STEPS,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_lora_file,
    image_array,
    load_tiny,
    model_cfg,
    run_to_the_end,
    tiny_model_folder,
    unseeded_batch,
    write_flow_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    arch_pipeline_render,
    interop_preview,
    trainer_preview,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

prx_dir = tiny_model_folder(PRXPixelModel, scope="session")


def prx_job(tmp: Path, model_dir: Path, name: str = "p", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "prx_pixel", model_dir, "shift", 2.0, lr=2e-2,
                          preview={"neg": ""}, **overrides)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, prx_dir: Path) -> Path:
    return run_to_the_end(prx_job(tmp_path_factory.mktemp("prx-run"), prx_dir))


def loaded_model(model_dir: Path, **cfg) -> PRXPixelModel:
    return load_tiny(PRXPixelModel, model_dir, **cfg)


def test_builds_and_loads_the_diffusers_layout(prx_dir: Path):
    from transformers import Qwen3VLTextModel

    assert {p.name for p in prx_dir.iterdir()} >= {"transformer", "text_encoder",
                                                   "tokenizer", "scheduler",
                                                   "model_index.json"}
    model = load_model(model_cfg("prx_pixel", prx_dir))
    assert isinstance(model, PRXPixelModel)
    assert type(model.text_encoder) is Qwen3VLTextModel  # the text tower alone
    assert model.noise_scale == 2.0 and model.prompt_max_tokens == 64  # model_index.json
    assert model.get_bucket_divisibility() == 16
    pixels = torch.rand(1, 3, 32, 48) * 2 - 1
    assert torch.equal(model.encode_images(pixels), pixels)  # pixel space: no VAE
    embeds = model.get_prompt_embeds(["a red circle", ""])
    # One row per real token (byte-level tokenizer: one per byte); "" has none.
    assert [t.shape[0] for t in embeds.text_embeds] == [len("a red circle"), 0]


def test_a_whole_qwen3_vl_checkpoint_loads_its_text_tower_alone(prx_dir: Path,
                                                                 tmp_path: Path):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    folder = tmp_path / "prx"
    folder.mkdir()
    for part in ("transformer", "tokenizer", "scheduler", "model_index.json"):
        (folder / part).symlink_to(prx_dir / part)
    text = json.loads((prx_dir / "text_encoder" / "config.json").read_text())
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters")
    full = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
        text_config={k: text[k] for k in keep},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32,
                       "num_heads": 2, "out_hidden_size": text["hidden_size"],
                       "deepstack_visual_indexes": []}))
    full.save_pretrained(folder / "text_encoder")
    model = loaded_model(folder)
    expected = full.model.language_model.state_dict()
    got = model.text_encoder.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_trains_previews_and_writes_the_lora_and_its_peft_folder(trained: Path,
                                                                 tmp_path: Path):
    lora = trained / "p.safetensors"
    assert_lora_file(lora, "diffusion_model.blocks.", "prx_pixel")
    assert (trained / "samples" / f"{STEPS:09d}_0.png").exists()
    weights = load_file(lora)
    # peft/ is the final file in peft's layout: same weights, its rank and alpha.
    config = json.loads((trained / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    peft_weights = load_file(trained / "peft" / "adapter_model.safetensors")
    internal = {k[len("diffusion_model."):]: v for k, v in weights.items()
                if not k.endswith(".alpha")}
    assert peft_weights.keys() == {"base_model.model." + k for k in internal}
    assert all(torch.equal(peft_weights["base_model.model." + k], v)
               for k, v in internal.items())
    assert set(config["target_modules"]) == {k.rsplit(".lora_", 1)[0] for k in internal}
    # The converter makes the same folder from the file.
    converted = convert_file(lora, tmp_path / "converted")
    assert load_file(converted / "adapter_model.safetensors").keys() == peft_weights.keys()
    again = json.loads((converted / "adapter_config.json").read_text())
    assert (again["r"], again["lora_alpha"], set(again["target_modules"])) == (
        4, 8, set(config["target_modules"]))


def test_loss_target_is_the_clean_image_against_a_hand_made_x_t(prx_dir: Path):
    model = loaded_model(prx_dir)
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    assert model.training_schedule.shift.shift == 3.0  # the scheduler's fixed shift
    clean = torch.rand(2, 3, 32, 32) * 2 - 1
    batch = DataBatch(captions=["a", "b"], latents=clean,
                      prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))
    seen = {}
    real = model.get_noise_prediction

    def spy(x, t, embeds, **kwargs):
        seen["x"], seen["t"] = x.detach().clone(), t.detach().clone()
        seen["pred"] = real(x, t, embeds, **kwargs)
        return seen["pred"]

    model.get_noise_prediction = spy
    loss = compute_loss(model, batch, step_generator(5, 2, 0))
    # The step's first draw is the noise: N(0, 1) times the model's noise_scale of 2.
    noise = 2.0 * torch.randn(clean.shape, generator=step_generator(5, 2, 0))
    s = (seen["t"] / 1000.0).view(-1, 1, 1, 1)
    assert ((s > 0) & (s < 1)).all()
    torch.testing.assert_close(seen["x"], (1 - s) * clean + s * noise)
    expected = torch.nn.functional.mse_loss(seen["pred"], clean)  # x-prediction
    torch.testing.assert_close(loss, expected)


def test_preview_samples_x0_as_velocity_with_the_pipelines_clamp(prx_dir: Path):
    """The preview equals a hand-written Euler loop: start at randn * 2, turn each
    predicted clean image into (x_t - x0) / max(s, 0.05)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    model = loaded_model(prx_dir)
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=48, sample_steps=3,
                              seed=4, guidance_scale=1.0)
    ours = image_array(model.generate_images([gen])[0])
    sched = FlowMatchEulerDiscreteScheduler.from_config(model.noise_scheduler.config)
    sched.set_timesteps(gen.sample_steps)
    embeds = model.get_prompt_embeds([gen.prompt])
    x = 2.0 * torch.randn((1, 3, 48, 32), generator=torch.Generator().manual_seed(gen.seed))
    with torch.no_grad():
        for i, t in enumerate(sched.timesteps):
            x0 = model.get_noise_prediction(x, t.reshape(1), embeds)
            s = sched.sigmas[i]
            x = x + (sched.sigmas[i + 1] - s) * (x - x0) / torch.clamp(s, min=0.05)
    mine = (x[0] / 2 + 0.5).clamp(0, 1).permute(1, 2, 0).numpy()
    assert ours.shape == (48, 32, 3)
    assert np.abs(mine - ours).max() <= 1 / 255 + 1e-6  # uint8 rounding


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, prx_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(prx_job(tmp_path, prx_dir), trained, monkeypatch)


def test_peft_on_the_diffusers_transformer_reproduces_the_trainer_preview(
        prx_dir: Path, trained: Path):
    """The run's own peft/ folder, loaded by peft, against the trainer's preview with
    the run's LoRA file."""
    from diffusers import PRXPixelPipeline, PRXTransformer2DModel
    from peft import PeftModel

    gen = interop_preview()
    ours, embeds = trainer_preview(loaded_model(prx_dir), trained / "p.safetensors", gen)
    transformer = PRXTransformer2DModel.from_pretrained(prx_dir, subfolder="transformer")
    pipe = PRXPixelPipeline.from_pretrained(prx_dir, transformer=transformer,
                                            text_encoder=None, tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""])
    base = theirs()
    PeftModel.from_pretrained(transformer, str(trained / "peft"))  # in place
    assert any("lora_B" in n for n, _ in pipe.transformer.named_parameters())
    with_lora = theirs()
    # Same float32 CPU math on both sides; PNG-level rounding is the only slack.
    assert np.abs(with_lora - ours).max() <= 1 / 255
    # The LoRA really changed the image (measured: 19/255 after the 4 steps).
    assert np.abs(with_lora - base).max() > 4 / 255


def test_a_lokr_adapter_saves_a_peft_folder_peft_loads_back(prx_dir: Path, tmp_path: Path):
    from diffusers import PRXTransformer2DModel
    from peft import PeftModel

    model = loaded_model(prx_dir)
    network = AdapterNetwork.attach(model, NetCfg(type="lokr", linear=4, linear_alpha=2.0))
    with torch.no_grad():
        for p in network.trainable_parameters():  # one factor starts at zero
            p.normal_(0.0, 0.2)
    network.save_file(tmp_path / "k.safetensors")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LOKR"
    fresh = PRXTransformer2DModel.from_pretrained(prx_dir, subfolder="transformer")
    PeftModel.from_pretrained(fresh, str(tmp_path / "peft"))
    x, t = torch.rand(1, 3, 32, 32) * 2 - 1, torch.tensor([600.0])
    embeds = model.get_prompt_embeds(["a red circle"])
    with torch.no_grad():
        ours = model.get_noise_prediction(x, t, embeds)
        context, mask = embeds.pad("text_embeds")
        theirs = fresh(hidden_states=x, timestep=t / 1000, encoder_hidden_states=context,
                       attention_mask=mask, return_dict=False)[0]
        network.disable()
        without = model.get_noise_prediction(x, t, embeds)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    assert (ours - without).abs().max() > 1e-2


def test_gradient_checkpointing_gives_the_same_lora_gradients(prx_dir: Path):
    # Pixel space: the batch's "latents" are its images (encode_images is the identity).
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(prx_dir), unseeded_batch)


def test_quantized_transformer_and_text_encoder_train_only_the_lora(prx_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(prx_dir, quantize=True, quantize_te=True)  # qfloat8 both
    assert is_quantized(model.model) and is_quantized(model.text_encoder)
    for kept in ("img_in", "txt_in", "time_in", "resolution_embedder", "final_layer"):
        assert not is_quantized(getattr(model.model, kept)), kept
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, unseeded_batch(model, 1))


def test_peft_converter_refuses_a_non_lora_file_in_one_line(tmp_path: Path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    assert peft_main([str(bad), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(bad) in err[0]
    assert not (tmp_path / "out").exists()


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, prx_dir: Path, hub_offline,
                                           capsys):
    # The hub library read the variable when first imported (earlier in this process); a
    # user's run reads it at start. Without this, the hub is tried over the network.
    path = prx_job(tmp_path, prx_dir,
                   model={"arch": "prx_pixel", "name_or_path": "Photoroom/prxpixel-t2i"})
    assert_hub_id_offline_is_one_line(path, "Photoroom/prxpixel-t2i", capsys,
                                      says=("hub id", "huggingface-cli download"))
