"""The `qwen_image` arch on a tiny random model built locally: load, train with LoRA,
preview, Ctrl+C and exact resume, and interop with diffusers' QwenImagePipeline
(`load_lora_weights` on the saved file gives the trainer's own preview)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from aitk import train as train_module
from aitk.adapters import AdapterNetwork
from aitk.cli_run import main as cli_main
from aitk.models.base import GenerateImageConfig
from aitk.models.qwen_image import QwenImageModel
from aitk.models.qwen_image.model import run_pipeline
from tests.aitk.aitk_testing import job_config, write_config
from tests.aitk.models.conftest import ModelCfg, NetCfg

STEPS = 4


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "qwen_image"
    QwenImageModel.build_tiny(folder)
    return folder


def qwen_job(tmp: Path, model_dir: Path, name: str = "q", **overrides) -> Path:
    settings = dict(
        # alpha != rank: the file must carry the scale other tools apply.
        network={"type": "lora", "linear": 4, "linear_alpha": 8},
        model={"arch": "qwen_image", "name_or_path": str(model_dir)},
        train={"batch_size": 2, "steps": STEPS, "lr": 5e-3, "optimizer": "adamw",
               "gradient_checkpointing": True, "cache_text_embeddings": True, "seed": 3,
               "timestep_type": "shift"},
        save={"dtype": "float32", "save_every": 2, "max_step_saves_to_keep": 2},
        sample={"sample_every": STEPS, "width": 32, "height": 32, "sample_steps": 2,
                "prompts": ["[trigger] a red circle"], "seed": 1, "format": "png",
                "guidance_scale": 1.0},
    )
    settings.update(overrides)
    cfg = job_config(name, tmp / "out", model_dir, **settings)
    return write_config(tmp / f"{name}.yml", cfg)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, qwen_dir: Path) -> Path:
    tmp = tmp_path_factory.mktemp("qwen-run")
    assert cli_main([str(qwen_job(tmp, qwen_dir))]) == 0
    return tmp / "out" / "q"


def loaded_model(model_dir: Path, **cfg) -> QwenImageModel:
    model = QwenImageModel(ModelCfg(name_or_path=str(model_dir), arch="qwen_image", **cfg))
    model.load_model()
    return model


def test_trains_previews_and_writes_the_diffusers_layout(trained: Path):
    lora = trained / "q.safetensors"
    weights = load_file(lora)
    assert weights and all(k.startswith("diffusion_model.transformer_blocks.")
                           for k in weights)
    alphas = {k: v for k, v in weights.items() if k.endswith(".alpha")}
    assert alphas and all(float(v) == 8.0 for v in alphas.values())
    ups = [v for k, v in weights.items() if k.endswith("lora_B.weight")]
    assert ups and all(torch.isfinite(v).all() for v in ups)
    assert any(v.abs().max() > 0 for v in ups)  # trained: B left zero-init
    with safe_open(str(lora), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == "qwen_image"
    assert (trained / "samples" / f"{STEPS:09d}_0.png").exists()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, qwen_dir: Path,
                                                            trained: Path, monkeypatch):
    path = qwen_job(tmp_path, qwen_dir)
    real = train_module.compute_loss
    calls = []

    def signalling(*args, **kwargs):  # a real SIGINT to this process during step 2
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "compute_loss", signalling)
    assert cli_main([str(path)]) == 130
    monkeypatch.setattr(train_module, "compute_loss", real)
    assert cli_main([str(path)]) == 0
    resumed = load_file(tmp_path / "out" / "q" / "q.safetensors")
    straight = load_file(trained / "q.safetensors")
    assert resumed.keys() == straight.keys()
    assert max((resumed[k] - straight[k]).abs().max().item() for k in straight) <= 1e-6


def image_array(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float32) / 255.0


def amplified(lora: Path, out: Path, factor: float = 30.0) -> Path:
    """The trained file with every up (B) weight scaled: four tiny steps move a random
    model's image by a pixel level; this makes the LoRA's effect plain to measure while
    keeping the trainer's keys, alphas and metadata."""
    from safetensors.torch import save_file

    with safe_open(str(lora), "pt") as fh:
        meta = fh.metadata()
    weights = {k: v * factor if k.endswith("lora_B.weight") else v
               for k, v in load_file(lora).items()}
    save_file(weights, str(out), metadata=meta)
    return out


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

    base = theirs()
    pipe.load_lora_weights(str(lora))
    assert any("lora_B" in n for n, _ in pipe.transformer.named_parameters())
    with_lora = theirs()
    # Same float32 CPU math on both sides; PNG-level rounding is the only slack.
    assert np.abs(with_lora - ours).max() <= 2 / 255
    assert np.abs(with_lora - base).max() > 4 / 255  # the LoRA really changed the image


def test_gradient_checkpointing_gives_the_same_lora_gradients(qwen_dir: Path):
    from aitk.batch import DataBatch
    from aitk.train import compute_loss, step_generator

    model = loaded_model(qwen_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    params = list(network.trainable_parameters())
    with torch.no_grad():
        for p in params:  # B starts at zero: give both factors values
            p.normal_(0.0, 0.05)
    batch = DataBatch(captions=["a", "b"],
                      latents=model.encode_images(torch.rand(2, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))

    def grads() -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        compute_loss(model, batch, step_generator(1, 0, 0)).backward()
        # Adapters on the last block's text stream feed nothing: no gradient at all.
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    model.model.train()
    plain = grads()
    model.model.enable_gradient_checkpointing()
    checkpointed = grads()
    assert any(g.abs().max() > 0 for g in plain)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_quantized_transformer_trains_only_the_lora(qwen_dir: Path):
    from aitk.batch import DataBatch
    from aitk.quantize import is_quantized
    from aitk.train import compute_loss, step_generator

    model = loaded_model(qwen_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model)
    assert not is_quantized(model.model.proj_out) and not is_quantized(model.model.img_in)
    network = AdapterNetwork.attach(model, NetCfg())
    batch = DataBatch(captions=["a"],
                      latents=model.encode_images(torch.rand(1, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle"]))
    loss = compute_loss(model, batch, step_generator(0, 0, 0))
    loss.backward()
    assert torch.isfinite(loss)
    trainable = {id(p) for p in network.trainable_parameters()}
    with_grad = [n for n, p in model.model.named_parameters() if p.grad is not None]
    assert with_grad and all("lora_" in n for n in with_grad)
    assert all(id(p) in trainable for p in model.model.parameters() if p.requires_grad)


def test_training_schedule_uses_the_models_dynamic_shift(qwen_dir: Path):
    from types import SimpleNamespace

    model = loaded_model(qwen_dir)
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    shift = model.training_schedule.shift
    assert shift.dynamic and shift.exponential and shift.max_seq_len == 8192
    assert shift.max_shift == pytest.approx(0.9)
    assert model.get_bucket_divisibility() == 32


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, qwen_dir: Path, monkeypatch,
                                           capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    path = qwen_job(tmp_path, qwen_dir,
                    model={"arch": "qwen_image", "name_or_path": "Qwen/Qwen-Image"})
    assert cli_main([str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "Qwen/Qwen-Image" in err[0] and "Traceback" not in err[0]
    assert "hub id" in err[0] and "huggingface-cli download" in err[0]
