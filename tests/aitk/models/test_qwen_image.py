"""The `qwen_image` arch on a tiny random model built locally: load, train with LoRA,
preview, Ctrl+C and exact resume, and interop with diffusers' QwenImagePipeline
(`load_lora_weights` on the saved file gives the trainer's own preview)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.models.base import GenerateImageConfig
from aitk.models.qwen_image.model import QwenImageModel, run_pipeline
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_loaded_lora_reproduces,
    assert_lora_file,
    assert_same_weights,
    image_array,
    interrupt_via_sigint_then_resume,
    last_step_sample,
    model_cfg,
    step_grads_without_and_with_checkpointing,
    tiny_model_folder,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg

pytestmark = pytest.mark.slow

qwen_dir = tiny_model_folder(QwenImageModel)


def qwen_job(tmp: Path, model_dir: Path, name: str = "q", **overrides: Any) -> Path:
    settings = dict(
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3, "timestep_type": "shift"},
        sample=last_step_sample(guidance_scale=1.0),
    )
    return write_lora_job(tmp, name, "qwen_image", model_dir, **{**settings, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, qwen_dir: Path) -> Path:
    tmp = tmp_path_factory.mktemp("qwen-run")
    assert cli_main([str(qwen_job(tmp, qwen_dir))]) == 0
    return tmp / "out" / "q"


def loaded_model(model_dir: Path, **cfg) -> QwenImageModel:
    model = QwenImageModel(model_cfg("qwen_image", model_dir, **cfg))
    model.load_model()
    return model


def test_trains_previews_and_writes_the_diffusers_layout(trained: Path):
    assert_lora_file(trained / "q.safetensors", "diffusion_model.transformer_blocks.",
                     "qwen_image")
    assert (trained / "samples" / f"{STEPS:09d}_0.png").exists()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, qwen_dir: Path,
                                                            trained: Path, monkeypatch):
    interrupt_via_sigint_then_resume([str(qwen_job(tmp_path, qwen_dir))], monkeypatch)
    assert_same_weights(tmp_path / "out" / "q" / "q.safetensors", trained / "q.safetensors")


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(qwen_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    from diffusers import QwenImagePipeline

    lora = amplified(trained / "q.safetensors", tmp_path / "strong.safetensors")
    model = loaded_model(qwen_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    network.load_file(lora)
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=32, sample_steps=3,
                              seed=5, guidance_scale=1.0)
    embeds = model.encode_prompts([gen.prompt, ""])
    ours = image_array(model.generate_images([gen], embeds)[0])

    pipe = QwenImagePipeline.from_pretrained(qwen_dir, text_encoder=None, tokenizer=None,
                                             dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    def theirs() -> np.ndarray:
        return image_array(run_pipeline(pipe, gen, embeds[gen.prompt], embeds[""],
                                        torch.Generator().manual_seed(gen.seed),
                                        torch.device("cpu"), torch.float32))

    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


def test_gradient_checkpointing_gives_the_same_lora_gradients(qwen_dir: Path):
    from aitk.data.batch import DataBatch

    model = loaded_model(qwen_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    params = list(network.trainable_parameters())
    with torch.no_grad():
        for p in params:  # B starts at zero: give both factors values
            p.normal_(0.0, 0.05)
    batch = DataBatch(captions=["a", "b"],
                      latents=model.encode_images(torch.rand(2, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))
    # Adapters on the last block's text stream feed nothing: no gradient at all (zeros).
    plain, checkpointed = step_grads_without_and_with_checkpointing(model, params, batch)
    assert any(g.abs().max() > 0 for g in plain)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_quantized_transformer_trains_only_the_lora(qwen_dir: Path):
    from aitk.data.batch import DataBatch
    from aitk.models.quantize import is_quantized

    model = loaded_model(qwen_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model)
    assert not is_quantized(model.model.proj_out) and not is_quantized(model.model.img_in)
    network = AdapterNetwork.attach(model, NetCfg())
    batch = DataBatch(captions=["a"],
                      latents=model.encode_images(torch.rand(1, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle"]))
    assert_a_step_reaches_only_the_lora(model, network, batch)


def test_training_schedule_uses_the_models_dynamic_shift(qwen_dir: Path):
    from types import SimpleNamespace

    model = loaded_model(qwen_dir)
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    shift = model.training_schedule.shift
    assert shift.dynamic and shift.exponential and shift.max_seq_len == 8192
    assert shift.max_shift == pytest.approx(0.9)
    assert model.get_bucket_divisibility() == 32


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, qwen_dir: Path, hub_offline,
                                           capsys):
    path = qwen_job(tmp_path, qwen_dir,
                    model={"arch": "qwen_image", "name_or_path": "Qwen/Qwen-Image"})
    assert cli_main([str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "Qwen/Qwen-Image" in err[0] and "Traceback" not in err[0]
    assert "hub id" in err[0] and "huggingface-cli download" in err[0]
