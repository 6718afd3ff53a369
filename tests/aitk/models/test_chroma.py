"""The `chroma` arch on a tiny random Chroma model (diffusers layout, built locally): load,
T5-only text with one kept pad token, train, preview, Ctrl+C and exact resume, LoRA files
ChromaPipeline loads, checkpointing, quantization, offline hub id."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.errors import EXIT_INPUT, EXIT_OK, ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.chroma.model import ChromaModel, kept_token_mask
from aitk.models.registry import load_model
from aitk.run.job import run_job
from tests.aitk.aitk_testing import job_config, write_config
from tests.aitk.models.arch_checks import (
    assert_a_step_moves_only_the_lora,
    assert_same_weights,
    assert_trained_lora,
    interrupt_via_stop_flag_then_resume,
    last_step_sample,
    model_cfg,
    prediction_grads,
    randomise,
    tiny_model_folder,
    train_cfg,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

chroma_cfg = partial(model_cfg, "chroma")
chroma_dir = tiny_model_folder(ChromaModel)


@pytest.fixture
def model(chroma_dir: Path) -> ChromaModel:
    m = load_model(chroma_cfg(chroma_dir))
    m.configure_training(train_cfg())
    return m


@pytest.fixture
def inputs(model: ChromaModel):
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 4, 6, generator=gen)  # a 32x48 image pair
    embeds = model.get_prompt_embeds(["a red square on grey", "cat"])  # unequal lengths
    return latents, torch.tensor([250.0, 800.0]), embeds


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

    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    randomise(net)
    path = tmp_path / "lora.safetensors"
    net.save_file(path, {"step": "1"}, dtype=torch.float32)
    keys = list(load_file(path))
    assert all(k.startswith("transformer.") for k in keys)
    assert "transformer.transformer_blocks.0.attn.to_q.alpha" in keys
    assert "transformer.single_transformer_blocks.0.proj_mlp.lora_A.weight" in keys
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
        return np.asarray(out.images[0], dtype=np.int16)

    plain = render()
    pipe.load_lora_weights(str(path))
    with_lora = render()
    ours = np.asarray(preview, dtype=np.int16)
    assert np.abs(with_lora - ours).max() <= 1  # tolerance: one 8-bit level
    assert np.abs(plain - ours).max() > 10  # the LoRA changes the image


def test_bf16_model_previews_through_the_float32_vae(chroma_dir: Path) -> None:
    m = ChromaModel(chroma_cfg(chroma_dir), dtype=torch.bfloat16)
    m.load_model()
    assert m.vae.dtype == torch.float32 and m.model.dtype == torch.bfloat16
    [image] = m.generate_images([GenerateImageConfig("a red circle", width=32, height=32,
                                                     sample_steps=2, guidance_scale=3.0)])
    assert image.size == (32, 32)


def test_old_diffusion_model_layout_reads_back(model: ChromaModel, tmp_path: Path) -> None:
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net)
    expected = net.state_dict()
    old = {("diffusion_model." + k.removeprefix("transformer.")): v
           for k, v in model.convert_lora_weights_before_save(expected).items()}
    save_file(old, str(tmp_path / "old.safetensors"))
    randomise(net, seed=2)
    net.load_file(tmp_path / "old.safetensors")
    assert all(torch.equal(net.state_dict()[k], v) for k, v in expected.items())


# ---- memory ----------------------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_gradients(model: ChromaModel, inputs) -> None:
    """With a padded batch: diffusers' checkpointed single blocks would run unmasked."""
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net)
    calls = []
    model.model.single_transformer_blocks[0].register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw.get("attention_mask") is not None),
        with_kwargs=True)
    loss_off, grads_off = prediction_grads(model, net, inputs, False)
    loss_on, grads_on = prediction_grads(model, net, inputs, True)
    assert len(calls) == 3 and all(calls)  # once without, twice with; always masked
    assert torch.equal(loss_on, loss_off)
    assert all(g.abs().sum() > 0 for g in grads_off)
    for a, b in zip(grads_off, grads_on, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert model.model._gradient_checkpointing_func.__name__ != "checkpointed"  # restored


def test_quantized_step_trains_only_the_lora(chroma_dir: Path) -> None:
    from optimum.quanto import QModuleMixin

    m = load_model(chroma_cfg(chroma_dir, quantize=True, qtype="qint8", quantize_te=True))
    m.configure_training(train_cfg())
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

    cfg = job_config("hub", tmp_path / "out", chroma_dir,
                     model={"arch": "chroma", "name_or_path": "lodestones/Chroma1-HD"})
    loaded = load_config(str(write_config(tmp_path / "hub.yml", cfg)))
    assert run_job(loaded) == EXIT_INPUT
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert "lodestones/Chroma1-HD" in errors[0] and "HF_TOKEN" in errors[0]


# ---- the job end to end -----------------------------------------------------------------------
def chroma_job(root: Path, chroma_dir: Path, name: str) -> Path:
    return write_lora_job(root, name, "chroma", chroma_dir,
                          train={"timestep_type": "flux_shift", "gradient_checkpointing": True,
                                 "lr": 5e-3},
                          sample=last_step_sample(guidance_scale=3.0))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, chroma_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("chroma-job")
    assert run_job(load_config(str(chroma_job(root, chroma_dir, "run")))) == EXIT_OK
    return root / "out" / "run"


def test_job_trains_saves_and_samples(straight: Path) -> None:
    assert_trained_lora(straight, "run", "transformer.")


def test_ctrl_c_then_resume_matches_the_uninterrupted_run(tmp_path: Path, chroma_dir: Path,
                                                          straight: Path, monkeypatch) -> None:
    """The in-process StopFlag path: a SIGINT handled mid-step 2 finishes the step,
    saves and exits 130; running again resumes to the same weights."""
    out = tmp_path / "out" / "run"
    interrupt_via_stop_flag_then_resume(chroma_job(tmp_path, chroma_dir, "run"),
                                        out / "run_000000002.safetensors", monkeypatch)
    assert_same_weights(out / "run.safetensors", straight / "run.safetensors")
