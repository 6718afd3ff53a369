"""The `flux` arch on a tiny random Flux model (diffusers layout, built locally): load,
train, preview, Ctrl+C and exact resume, LoRA files diffusers loads, checkpointing,
quantization, guidance, assistant LoRA, offline hub id."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from aitk.adapters import AdapterNetwork
from aitk.errors import ModelLoadError
from aitk.models.base import GenerateImageConfig
from aitk.models.flux.model import FluxModel
from aitk.models.registry import load_model
from tests.aitk.models.arch_checks import (
    assert_a_step_moves_only_the_lora,
    assert_stop_flag_resume_matches,
    assert_trained_lora,
    loaded_for_training,
    model_cfg,
    ran_in_process,
    randomise,
    tiny_model_folder,
    train_cfg,
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

pytestmark = pytest.mark.slow

flux_cfg = partial(model_cfg, "flux")
flux_dir = tiny_model_folder(FluxModel)


@pytest.fixture
def model(flux_dir: Path) -> FluxModel:
    return loaded_for_training("flux", flux_dir)


@pytest.fixture
def inputs(model: FluxModel):
    return prediction_inputs(model)


# ---- load, encoders, shapes --------------------------------------------------------------
def test_builds_and_loads_through_the_registry(model: FluxModel, flux_dir: Path) -> None:
    for part in ("transformer", "text_encoder", "tokenizer", "text_encoder_2",
                 "tokenizer_2", "vae", "scheduler"):
        assert (flux_dir / part).is_dir()
    assert isinstance(model, FluxModel) and model.arch == "flux"
    assert model.get_bucket_divisibility() == 16  # VAE 8 x packing 2
    assert not any(p.requires_grad for p in model.model.parameters())


def test_latents_embeds_and_prediction_shapes(model: FluxModel, inputs) -> None:
    pixels = torch.rand(2, 3, 32, 48) * 2 - 1
    latents = model.encode_images(pixels)
    assert latents.shape == (2, 4, 4, 6)
    with torch.no_grad():
        dist = model.vae.encode(pixels).latent_dist.mean
    cfg = model.vae.config
    assert torch.allclose(latents, (dist - cfg.shift_factor) * cfg.scaling_factor)
    _, timesteps, embeds = inputs
    assert [tuple(t.shape) for t in embeds.text_embeds] == [(32, 32)] * 2  # T5 (L, D)
    assert [tuple(t.shape) for t in embeds.pooled_embeds] == [(1, 32)] * 2  # CLIP pooled
    with torch.no_grad():
        pred = model.get_noise_prediction(latents, timesteps, embeds)
    assert pred.shape == latents.shape


def test_timesteps_go_in_as_fractions(model: FluxModel, inputs) -> None:
    latents, timesteps, embeds = inputs
    seen = {}
    model.model.register_forward_pre_hook(
        lambda m, a, kw: seen.update(t=kw["timestep"], g=kw["guidance"]), with_kwargs=True)
    with torch.no_grad():
        model.get_noise_prediction(latents, timesteps, embeds)
    assert torch.allclose(seen["t"], timesteps / 1000)
    assert torch.equal(seen["g"], torch.ones(2))  # cfg_scale 1.0 by default


def test_schedule_reads_the_dynamic_shift_over_2x2_tokens(model: FluxModel) -> None:
    schedule = model.training_schedule
    assert schedule.shift.dynamic
    assert (schedule.shift.base_shift, schedule.shift.max_shift) == (0.5, 1.15)
    assert schedule.seq_len(torch.zeros(1, 16, 128, 128)) == 4096  # 1024 px
    assert schedule.shift.mu(4096) == pytest.approx(1.15)


# ---- guidance ---------------------------------------------------------------------------
def test_guidance_is_cfg_scale_or_bypassed(model: FluxModel, inputs) -> None:
    latents, timesteps, embeds = inputs
    calls = []
    model.model.time_text_embed.guidance_embedder.register_forward_hook(
        lambda *a: calls.append(1))
    with torch.no_grad():
        model.configure_training(train_cfg(cfg_scale=3.5))
        assert model.training_guidance() == 3.5
        guided = model.get_noise_prediction(latents, timesteps, embeds)
        assert calls == [1]
        model.configure_training(train_cfg(bypass_guidance_embedding=True))
        assert model.training_guidance() is None
        bypassed = model.get_noise_prediction(latents, timesteps, embeds)
        assert calls == [1]  # the guidance embedder never ran
    assert not torch.allclose(guided, bypassed)
    assert "forward" not in vars(model.model.time_text_embed)  # restored after the call


def test_schnell_has_no_guidance(tmp_path: Path) -> None:
    from aitk.models.flux.tiny import FluxSizes, build_tiny_flux

    build_tiny_flux(tmp_path / "schnell", sizes=FluxSizes(guidance_embeds=False))
    m = load_model(flux_cfg(tmp_path / "schnell"))
    m.configure_training(train_cfg(cfg_scale=4.0))
    assert m.training_guidance() is None
    with torch.no_grad():
        out = m.get_noise_prediction(torch.randn(1, 4, 2, 2), torch.tensor([500.0]),
                                     m.get_prompt_embeds(["x"]))
    assert out.shape == (1, 4, 2, 2)


# ---- LoRA files ----------------------------------------------------------------------------
def test_saved_lora_loads_in_diffusers_and_gives_the_preview(model: FluxModel,
                                                             flux_dir: Path,
                                                             tmp_path: Path) -> None:
    """The trainer's preview with its LoRA == diffusers' FluxPipeline after
    load_lora_weights(file), same seed and embeds; and != the image without the LoRA."""
    from diffusers import FluxPipeline

    path = save_random_lora(model, tmp_path / "lora.safetensors")
    gen_cfg = GenerateImageConfig("a red circle", width=32, height=32, seed=5,
                                  guidance_scale=3.5, sample_steps=3)
    embeds = model.encode_prompts([gen_cfg.prompt])
    [preview] = model.generate_images([gen_cfg], prompt_embeds=embeds)

    pipe = FluxPipeline.from_pretrained(flux_dir)
    pipe.set_progress_bar_config(disable=True)
    e = embeds[gen_cfg.prompt]

    def render() -> np.ndarray:
        out = pipe(prompt_embeds=e.text_embeds[0][None], pooled_prompt_embeds=e.pooled_embeds[0],
                   width=32, height=32, num_inference_steps=3, guidance_scale=3.5,
                   generator=torch.Generator().manual_seed(5), output_type="pil")
        return image_levels(out.images[0])

    assert_lora_turns_the_render_into_the_preview(pipe, path, image_levels(preview), render,
                                                  changed_by=10)


def test_bf16_model_previews_through_the_float32_vae(flux_dir: Path) -> None:
    """The transformer in bf16 and the VAE in float32 (as loaded): the pipeline's latents
    are decoded by the model's own float32 decode, not fed to the VAE as bf16."""
    assert_bf16_previews_through_the_float32_vae(FluxModel, flux_dir)


def test_old_diffusion_model_layout_reads_back(model: FluxModel, tmp_path: Path) -> None:
    assert_old_layout_reads_back(
        model, tmp_path, {"transformer_blocks.0.attn.to_q.alpha": torch.tensor(4.0)})


# ---- memory ----------------------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_gradients(model: FluxModel, inputs) -> None:
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net)
    calls = []
    model.model.transformer_blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    assert_checkpointing_keeps_the_prediction_grads(model, net, inputs)
    assert len(calls) == 3  # once without, twice (forward + recompute) with


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8", "qint4"])
def test_quantized_step_trains_only_the_lora(flux_dir: Path, qtype: str) -> None:
    from optimum.quanto import QModuleMixin

    m = loaded_for_training("flux", flux_dir, quantize=True, qtype=qtype, quantize_te=True)
    tr = m.model
    assert isinstance(tr.transformer_blocks[0].attn.to_q, QModuleMixin)
    assert isinstance(tr.single_transformer_blocks[0].proj_out, QModuleMixin)
    for kept in (tr.x_embedder, tr.context_embedder, tr.proj_out, tr.norm_out.linear,
                 tr.time_text_embed.timestep_embedder.linear_1):
        assert not isinstance(kept, QModuleMixin)
    net = AdapterNetwork.attach(m, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net, scale=0.1)
    assert_a_step_moves_only_the_lora(m, net, "a cat")


def test_low_vram_moves_idle_parts_only_while_used(model: FluxModel) -> None:
    moves = []

    class Part(torch.nn.Module):
        def to(self, *args, **kwargs):
            moves.append(str(args[0]))
            return self

    model.model_config.low_vram = True
    model.device = torch.device("cuda")  # nothing runs on it: only the moves are recorded
    with model.on_device(Part()):
        moves.append("used")
    assert moves == ["cuda", "used", "cpu"]


# ---- assistant LoRA ----------------------------------------------------------------------
def test_assistant_lora_is_merged_into_the_frozen_weights(flux_dir: Path,
                                                          tmp_path: Path) -> None:
    plain = load_model(flux_cfg(flux_dir)).model
    name = "single_transformer_blocks.0.proj_mlp"
    layer = plain.get_submodule(name)
    down = torch.randn(2, layer.in_features)
    up = torch.randn(layer.out_features, 2)
    save_file({f"transformer.{name}.lora_A.weight": down,
               f"transformer.{name}.lora_B.weight": up,
               f"transformer.{name}.alpha": torch.tensor(1.0)},
              str(tmp_path / "assist.safetensors"))
    m = load_model(flux_cfg(flux_dir, assistant_lora_path=str(tmp_path / "assist.safetensors")))
    merged = m.model.get_submodule(name).weight
    assert torch.allclose(merged, layer.weight + up @ down * 0.5, atol=1e-5)
    assert not merged.requires_grad
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(flux_cfg(flux_dir, assistant_lora_path=str(tmp_path / "none")))


# ---- loading errors ------------------------------------------------------------------------
def test_missing_part_and_offline_hub_id_are_one_line_errors(flux_dir: Path, tmp_path: Path,
                                                             hub_offline, capsys) -> None:
    import shutil


    partial = tmp_path / "partial"
    shutil.copytree(flux_dir, partial)
    shutil.rmtree(partial / "vae")
    with pytest.raises(ModelLoadError, match="lacks vae/"):
        load_model(flux_cfg(partial))

    assert_hub_job_is_one_line(tmp_path, flux_dir, "flux", "black-forest-labs/FLUX.1-dev", capsys)


# ---- the job end to end -----------------------------------------------------------------------
def flux_job(root: Path, flux_dir: Path, name: str) -> Path:
    return write_lora_job(root, name, "flux", flux_dir, train={
        "timestep_type": "flux_shift", "gradient_checkpointing": True, "lr": 5e-3})


@pytest.fixture(scope="module")
def straight(tmp_path_factory, flux_dir: Path) -> Path:
    return ran_in_process(flux_job(tmp_path_factory.mktemp("flux-job"), flux_dir, "run"))


def test_job_trains_saves_and_samples(straight: Path) -> None:
    assert_trained_lora(straight, "run", "transformer.")


def test_ctrl_c_then_resume_matches_the_uninterrupted_run(tmp_path: Path, flux_dir: Path,
                                                          straight: Path, monkeypatch) -> None:
    """The in-process StopFlag path: a SIGINT handled mid-step 2 finishes the step,
    saves and exits 130; running again resumes to the same weights."""
    assert_stop_flag_resume_matches(flux_job(tmp_path, flux_dir, "run"), straight,
                                    monkeypatch)


# ---- model.attn_masking (upstream's padded-T5 mask) -------------------------------------
def test_attn_masking_zeroes_the_t5_states_of_the_padding_tokens(flux_dir: Path) -> None:
    """Upstream's `model.attn_masking` for Flux: the T5 states past each prompt's own
    tokens are zeroed (the text it said stays as it was), and the cached embeddings of
    the two settings are told apart."""
    plain = load_model(flux_cfg(flux_dir))
    masked = load_model(flux_cfg(flux_dir, attn_masking=True))
    prompts = ["cat", "a red square on grey"]
    before = plain.get_prompt_embeds(prompts)
    after = masked.get_prompt_embeds(prompts)
    for i, prompt in enumerate(prompts):
        said = int(masked.tokenizer_2(prompt, return_tensors="pt").attention_mask.sum())
        assert said < after["text_embeds"][i].shape[0]  # the test has padding to zero
        assert torch.equal(after["text_embeds"][i][:said], before["text_embeds"][i][:said])
        assert torch.count_nonzero(before["text_embeds"][i][said:]) > 0
        assert torch.count_nonzero(after["text_embeds"][i][said:]) == 0
    assert torch.equal(after["pooled_embeds"][0], before["pooled_embeds"][0])
    assert masked.text_embedding_space_version != plain.text_embedding_space_version
