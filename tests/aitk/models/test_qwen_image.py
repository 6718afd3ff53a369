"""The `qwen_image` arch on a tiny random model built locally: load, train with LoRA,
preview, Ctrl+C and exact resume, and interop with diffusers' QwenImagePipeline
(`load_lora_weights` on the saved file gives the trainer's own preview)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from aitk.adapters import AdapterNetwork
from aitk.models.qwen_image.model import QwenImageModel, run_pipeline
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    assert_lora_file,
    load_tiny,
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

pytestmark = pytest.mark.slow

qwen_dir = tiny_model_folder(QwenImageModel)


def qwen_job(tmp: Path, model_dir: Path, name: str = "q", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "qwen_image", model_dir, "shift", 1.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, qwen_dir: Path) -> Path:
    return run_to_the_end(qwen_job(tmp_path_factory.mktemp("qwen-run"), qwen_dir))


def loaded_model(model_dir: Path, **cfg) -> QwenImageModel:
    return load_tiny(QwenImageModel, model_dir, **cfg)


def test_trains_previews_and_writes_the_diffusers_layout(trained: Path):
    assert_lora_file(trained / "q.safetensors", "diffusion_model.transformer_blocks.",
                     "qwen_image")
    assert (trained / "samples" / f"{STEPS:09d}_0.png").exists()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, qwen_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(qwen_job(tmp_path, qwen_dir), trained, monkeypatch)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(qwen_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    from diffusers import QwenImagePipeline

    lora = amplified(trained / "q.safetensors", tmp_path / "strong.safetensors")
    gen = interop_preview(guidance_scale=1.0)
    ours, embeds = trainer_preview(loaded_model(qwen_dir), lora, gen)
    pipe = QwenImagePipeline.from_pretrained(qwen_dir, text_encoder=None, tokenizer=None,
                                             dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""])
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


def test_gradient_checkpointing_gives_the_same_lora_gradients(qwen_dir: Path):
    # Adapters on the last block's text stream feed nothing: no gradient at all (zeros).
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(qwen_dir), unseeded_batch,
                                                  reached=any)


def test_quantized_transformer_trains_only_the_lora(qwen_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(qwen_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model)
    assert not is_quantized(model.model.proj_out) and not is_quantized(model.model.img_in)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, unseeded_batch(model, 1))


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
    assert_hub_id_offline_is_one_line(path, "Qwen/Qwen-Image", capsys,
                                      says=("hub id", "huggingface-cli download"))
