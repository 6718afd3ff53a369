"""The `chroma` arch on a tiny random Chroma model (diffusers layout, built locally): load,
T5-only text with one kept pad token, train, preview, Ctrl+C and exact resume, LoRA files
ChromaPipeline loads, checkpointing, quantization, offline hub id."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.errors import ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.chroma.model import ChromaModel, kept_token_mask
from aitk.models.registry import load_model
from tests.aitk.models.arch_checks import (
    assert_a_step_moves_only_the_lora,
    assert_stop_flag_resume_matches,
    assert_trained_lora,
    last_step_sample,
    loaded_for_training,
    model_cfg,
    ran_in_process,
    randomise,
    tiny_model_folder,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.flux_checks import (
    assert_checkpointing_keeps_the_prediction_grads,
    assert_hub_job_is_one_line,
    assert_old_layout_reads_back,
    prediction_inputs,
    save_random_lora,
)
from tests.aitk.models.pipeline_checks import (
    assert_bf16_previews_through_the_float32_vae,
    assert_lora_turns_the_render_into_the_preview,
    image_levels,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

chroma_cfg = partial(model_cfg, "chroma")
chroma_dir = tiny_model_folder(ChromaModel)


@pytest.fixture
def model(chroma_dir: Path) -> ChromaModel:
    return loaded_for_training("chroma", chroma_dir)


@pytest.fixture
def inputs(model: ChromaModel):
    return prediction_inputs(model)  # prompts of unequal lengths


# ---- load, text, shapes ------------------------------------------------------------------
def test_builds_and_loads_through_the_registry(model: ChromaModel, chroma_dir: Path) -> None:
    for part in ("transformer", "text_encoder", "tokenizer", "vae", "scheduler"):
        assert (chroma_dir / part).is_dir()
    assert not (chroma_dir / "text_encoder_2").exists()  # T5 only, no CLIP
    assert isinstance(model, ChromaModel) and model.arch == "chroma"
    assert model.get_bucket_divisibility() == 16  # VAE 8 x packing 2
    assert not any(p.requires_grad for p in model.model.parameters())


def test_the_mask_keeps_exactly_one_pad_token(model: ChromaModel, chroma_dir: Path) -> None:
    """Per prompt: the real tokens (incl. EOS) and ONE pad token, with the states that
    ChromaPipeline's own encoder gives those positions; a prompt that fills the
    sequence keeps all of it."""
    from diffusers import ChromaPipeline

    assert kept_token_mask(torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])).tolist() == [
        [True, True, True, True, False, False], [True] * 6]
    prompts = ["a red square on grey", "cat", "x" * 100]
    embeds = model.get_prompt_embeds(prompts)
    ids = model.tokenizer(prompts, padding="max_length", max_length=32, truncation=True)
    real = [sum(m) for m in ids["attention_mask"]]
    assert real[:2] == [len(prompts[0]) + 1, len(prompts[1]) + 1]  # bytes + EOS
    assert [t.shape[0] for t in embeds.text_embeds] == [real[0] + 1, real[1] + 1, 32]
    assert ids["input_ids"][0][real[0]] == model.tokenizer.pad_token_id  # the kept pad

    pipe = ChromaPipeline.from_pretrained(chroma_dir)
    states, mask = pipe._get_t5_prompt_embeds(prompts, max_sequence_length=32,
                                               device=torch.device("cpu"))
    for i, ours in enumerate(embeds.text_embeds):
        kept = mask[i].bool()
        assert int(kept.sum()) == ours.shape[0]
        assert torch.allclose(states[i][kept], ours, atol=1e-5)


def test_padded_batch_predicts_each_item_as_alone(model: ChromaModel, inputs) -> None:
    """Two prompts of different lengths in one batch: the pad is masked out, so each
    item's prediction is what it gets alone; no guidance value reaches the model."""
    latents, timesteps, embeds = inputs
    seen = {}
    model.model.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    with torch.no_grad():
        both = model.get_noise_prediction(latents, timesteps, embeds)
        assert torch.allclose(seen["timestep"], timesteps / 1000)
        assert "guidance" not in seen and "pooled_projections" not in seen
        assert seen["attention_mask"].dtype == torch.bool
        assert int((~seen["attention_mask"]).sum()) == 22 - 5  # 20 bytes + EOS + pad vs 3 + 2
        for i in range(2):
            alone = model.get_noise_prediction(latents[i:i + 1], timesteps[i:i + 1],
                                               embeds.select([i]))
            assert torch.allclose(both[i:i + 1], alone, atol=1e-5)
    assert both.shape == latents.shape


def test_schedule_reads_the_dynamic_shift_over_2x2_tokens(model: ChromaModel) -> None:
    schedule = model.training_schedule
    assert schedule.shift.dynamic
    assert schedule.seq_len(torch.zeros(1, 16, 128, 128)) == 4096  # 1024 px
    assert schedule.shift.mu(4096) == pytest.approx(1.15)
    assert model.training_guidance() is None


# ---- LoRA files ----------------------------------------------------------------------------
def test_saved_lora_loads_in_diffusers_and_gives_the_preview(model: ChromaModel,
                                                             chroma_dir: Path,
                                                             tmp_path: Path) -> None:
    """The trainer's preview (true CFG with the negative prompt) with its LoRA ==
    diffusers' ChromaPipeline after load_lora_weights(file), same seed and embeds; and
    != the image without the LoRA."""
    from diffusers import ChromaPipeline

    path = save_random_lora(model, tmp_path / "lora.safetensors")
    assert "transformer.single_transformer_blocks.0.proj_mlp.lora_A.weight" in load_file(path)
    gen_cfg = GenerateImageConfig("a red circle", width=32, height=32, seed=5,
                                  guidance_scale=3.0, sample_steps=3,
                                  negative_prompt="blurry")
    embeds = model.encode_prompts([gen_cfg.prompt, gen_cfg.negative_prompt])
    [preview] = model.generate_images([gen_cfg], prompt_embeds=embeds)

    pipe = ChromaPipeline.from_pretrained(chroma_dir)
    pipe.set_progress_bar_config(disable=True)
    cond = embeds[gen_cfg.prompt].text_embeds[0][None]
    neg = embeds[gen_cfg.negative_prompt].text_embeds[0][None]

    def render() -> np.ndarray:
        out = pipe(prompt_embeds=cond, prompt_attention_mask=torch.ones(cond.shape[:2]),
                   negative_prompt_embeds=neg,
                   negative_prompt_attention_mask=torch.ones(neg.shape[:2]),
                   width=32, height=32, num_inference_steps=3, guidance_scale=3.0,
                   generator=torch.Generator().manual_seed(5), output_type="pil")
        return image_levels(out.images[0])

    assert_lora_turns_the_render_into_the_preview(pipe, path, image_levels(preview), render,
                                                  changed_by=10)


def test_bf16_model_previews_through_the_float32_vae(chroma_dir: Path) -> None:
    assert_bf16_previews_through_the_float32_vae(ChromaModel, chroma_dir, guidance_scale=3.0)


def test_old_diffusion_model_layout_reads_back(model: ChromaModel, tmp_path: Path) -> None:
    assert_old_layout_reads_back(model, tmp_path)


# ---- memory ----------------------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_gradients(model: ChromaModel, inputs) -> None:
    """With a padded batch: diffusers' checkpointed single blocks would run unmasked."""
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net)
    calls = []
    model.model.single_transformer_blocks[0].register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw.get("attention_mask") is not None),
        with_kwargs=True)
    assert_checkpointing_keeps_the_prediction_grads(model, net, inputs, reached=all)
    assert len(calls) == 3 and all(calls)  # once without, twice with; always masked
    assert model.model._gradient_checkpointing_func.__name__ != "checkpointed"  # restored


def test_quantized_step_trains_only_the_lora(chroma_dir: Path) -> None:
    from optimum.quanto import QModuleMixin

    m = loaded_for_training("chroma", chroma_dir, quantize=True, qtype="qint8",
                            quantize_te=True)
    tr = m.model
    assert isinstance(tr.transformer_blocks[0].attn.to_q, QModuleMixin)
    assert isinstance(tr.single_transformer_blocks[0].proj_out, QModuleMixin)
    for kept in (tr.x_embedder, tr.context_embedder, tr.proj_out,
                 tr.distilled_guidance_layer.in_proj, tr.distilled_guidance_layer.out_proj):
        assert not isinstance(kept, QModuleMixin)
    net = AdapterNetwork.attach(m, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net, scale=0.1)
    assert_a_step_moves_only_the_lora(m, net, "a")


# ---- loading errors ------------------------------------------------------------------------
def test_missing_part_and_offline_hub_id_are_one_line_errors(chroma_dir: Path, tmp_path: Path,
                                                             hub_offline, capsys) -> None:
    import shutil


    partial = tmp_path / "partial"
    shutil.copytree(chroma_dir, partial)
    shutil.rmtree(partial / "vae")
    with pytest.raises(ModelLoadError, match="lacks vae/"):
        load_model(chroma_cfg(partial))
    with pytest.raises(ModelLoadError, match="single file.*lodestones/Chroma1-HD"):
        load_model(chroma_cfg("lodestones/Chroma/chroma-unlocked-v48.safetensors"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(chroma_cfg(tmp_path / "nowhere"))

    assert_hub_job_is_one_line(tmp_path, chroma_dir, "chroma", "lodestones/Chroma1-HD", capsys)


# ---- the job end to end -----------------------------------------------------------------------
def chroma_job(root: Path, chroma_dir: Path, name: str) -> Path:
    return write_lora_job(root, name, "chroma", chroma_dir,
                          train={"timestep_type": "flux_shift", "gradient_checkpointing": True,
                                 "lr": 5e-3},
                          sample=last_step_sample(guidance_scale=3.0))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, chroma_dir: Path) -> Path:
    return ran_in_process(chroma_job(tmp_path_factory.mktemp("chroma-job"), chroma_dir,
                                     "run"))


def test_job_trains_saves_and_samples(straight: Path) -> None:
    assert_trained_lora(straight, "run", "transformer.")


def test_ctrl_c_then_resume_matches_the_uninterrupted_run(tmp_path: Path, chroma_dir: Path,
                                                          straight: Path, monkeypatch) -> None:
    """The in-process StopFlag path: a SIGINT handled mid-step 2 finishes the step,
    saves and exits 130; running again resumes to the same weights."""
    assert_stop_flag_resume_matches(chroma_job(tmp_path, chroma_dir, "run"), straight,
                                    monkeypatch)
