"""The `flux2` arch (FLUX.2 [dev]) on a tiny random model built locally: an edit LoRA
with two references trained end to end, previews, Ctrl+C and exact resume, the kohya/BFL
layout ComfyUI maps, interop with diffusers' Flux2Pipeline (`load_lora_weights` on the
saved file gives the trainer's own preview, references included), the reference tokens
and ids as the pipeline builds them, the guidance embedding, Mistral's trimmed language
model, gradient checkpointing, quantization and the offline hub error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.models.flux2.model import Flux2Model, run_pipeline
from tests.aitk.aitk_testing import REPO
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    load_tiny,
    more_than_half,
    run_to_the_end,
    tiny_model_folder,
    write_edit_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    arch_pipeline_render,
    float32_pipeline,
    interop_preview,
    trainer_preview,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

flux2_dir = tiny_model_folder(Flux2Model)
DATA = REPO / "datasets" / "example_edit"
CTRLS = [str(DATA / "control" / "circle_to_red.png"),
         str(DATA / "control_2" / "circle_to_red.png")]

# ComfyUI runs FLUX.2 with BFL's module names: comfy/lora.py model_lora_keys_unet maps
# `lora_unet_` + each `diffusion_model.` weight's name (dots as `_`). Per block:
COMFY_DOUBLE = ("img_attn_qkv", "img_attn_proj", "img_mlp_0", "img_mlp_2",
                "txt_attn_qkv", "txt_attn_proj", "txt_mlp_0", "txt_mlp_2")
COMFY_SINGLE = ("linear1", "linear2")


def flux2_job(tmp: Path, model_dir: Path, name: str = "f", **overrides: Any) -> Path:
    return write_edit_job(
        tmp, name, "flux2", model_dir,
        pairs=[{"folder_path": str(DATA), "resolution": [32],
                "control_path": [str(DATA / "control"), str(DATA / "control_2")]}],
        samples=[{"prompt": "make the circle red", "ctrl_img_1": CTRLS[0],
                  "ctrl_img_2": CTRLS[1]}],
        guidance_scale=3.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, flux2_dir: Path) -> Path:
    return run_to_the_end(flux2_job(tmp_path_factory.mktemp("flux2-run"), flux2_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> Flux2Model:
    model = load_tiny(Flux2Model, model_dir, **cfg)
    model.configure_training(SimpleNamespace(timestep_type="shift", cfg_scale=1.0))
    return model


def edit_batch(model: Flux2Model, size: int = 2) -> DataBatch:
    gen = torch.Generator().manual_seed(0)
    pixels = torch.rand(size, 3, 32, 48, generator=gen) * 2 - 1
    controls = [torch.rand(size, 3, 32, 48, generator=gen),
                torch.rand(size, 3, 48, 32, generator=gen)]
    prompts = ["make the circle red", "blue"][:size]
    return DataBatch(captions=prompts, tensor=pixels, latents=model.encode_images(pixels),
                     prompt_embeds=model.get_prompt_embeds(prompts),
                     control_tensor=controls[0], control_tensor_list=controls)


# ---- the job end to end, and the file it writes -------------------------------------------
def test_trains_an_edit_lora_in_the_layout_comfyui_maps(trained: Path):
    from safetensors import safe_open

    lora = trained / "f.safetensors"
    weights = load_file(lora)
    modules = {k.split(".")[0] for k in weights}
    assert modules == {f"lora_unet_double_blocks_0_{m}" for m in COMFY_DOUBLE} | {
        f"lora_unet_single_blocks_0_{m}" for m in COMFY_SINGLE}
    assert all(k.endswith((".lora_down.weight", ".lora_up.weight", ".alpha")) for k in weights)
    # q, k and v are one fused qkv: rank 3 x 4, alpha 3 x 8 (the same scale).
    assert float(weights["lora_unet_double_blocks_0_img_attn_qkv.alpha"]) == 24.0
    assert float(weights["lora_unet_single_blocks_0_linear1.alpha"]) == 8.0
    ups = [v for k, v in weights.items() if k.endswith("lora_up.weight")]
    assert any(v.abs().max() > 0 for v in ups)
    with safe_open(str(lora), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == "flux2"
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, flux2_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(flux2_job(tmp_path, flux2_dir), trained, monkeypatch)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(flux2_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    from diffusers import Flux2Pipeline

    from aitk.data.controls import open_sample_control

    lora = amplified(trained / "f.safetensors", tmp_path / "strong.safetensors")
    gen = interop_preview(prompt="make the circle red", guidance_scale=3.0,
                          ctrl_img=CTRLS[0], ctrl_imgs=CTRLS)
    ours, embeds = trainer_preview(loaded_model(flux2_dir), lora, gen)
    pipe = float32_pipeline(Flux2Pipeline, flux2_dir)
    references = [open_sample_control(p).resize((64, 64)) for p in CTRLS]  # the floor
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt],
                                  extra=(references,))
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


# ---- what the arch's edges do ------------------------------------------------------------
def test_mistral_loads_as_its_language_model_cut_after_the_deepest_layer_read(
        flux2_dir: Path):
    from diffusers import Flux2Pipeline
    from transformers import MistralModel

    model = loaded_model(flux2_dir)
    assert type(model.text_encoder) is MistralModel and len(model.text_encoder.layers) == 31
    full = Flux2Pipeline.from_pretrained(flux2_dir)
    assert len(full.text_encoder.model.language_model.layers) == 31  # the tiny one's all
    theirs, _ = full.encode_prompt(["a red circle", "blue"], max_sequence_length=256)
    ours = model.get_prompt_embeds(["a red circle", "blue"]).text_embeds
    for mine, pipeline in zip(ours, theirs, strict=True):
        assert torch.allclose(mine, pipeline, atol=1e-5)
    cut = loaded_model(flux2_dir, model_kwargs={"text_encoder_out_layers": [2, 5, 9]})
    assert len(cut.text_encoder.layers) == 10
    rows = cut.get_prompt_embeds(["a red circle"]).text_embeds[0]
    assert rows.shape == (256, 3 * 32)


def test_references_are_the_pipelines_tokens_and_ids(flux2_dir: Path):
    """With two references the transformer sees the noisy tokens, then each reference
    encoded and packed as Flux2Pipeline.prepare_image_latents does it, with its ids
    (10 (i + 1), h, w, 0); the prediction is the noisy part, and it reads the refs."""
    from diffusers import Flux2Pipeline as Pipe

    model = loaded_model(flux2_dir)
    batch = edit_batch(model)
    latents, embeds = batch.latents, batch.prompt_embeds
    seq = model.condition_noisy_latents(latents, batch)
    # 2x3 noisy tokens; the references raised to the pipeline's 64 px floor: 4x6, 6x4.
    assert seq.shape == (2, 6 + 24 + 24, model.model.config.in_channels)
    t = torch.tensor([250.0, 800.0])
    pipe = Pipe(scheduler=model.noise_scheduler, vae=model.vae, text_encoder=None,
                tokenizer=None, transformer=model.model)
    with torch.no_grad():
        ours = model.get_noise_prediction(seq, t, embeds, batch=batch)
        refs, ref_ids = [], []
        for i in range(2):
            # The controls (32x48, 48x32) at the 64 px floor, as the trainer sizes them.
            controls = [F.interpolate(c[i:i + 1], size=size, mode="bilinear",
                                      antialias=True) * 2 - 1
                        for c, size in zip(batch.control_tensor_list, [(64, 96), (96, 64)],
                                           strict=True)]
            r, ids = pipe.prepare_image_latents(controls, 1, None, torch.device("cpu"),
                                                torch.float32)
            refs.append(r)
            ref_ids.append(ids)
        tokens = torch.cat([Pipe._pack_latents(latents), torch.cat(refs)], dim=1)
        ids = torch.cat([Pipe._prepare_latent_ids(latents), torch.cat(ref_ids)], dim=1)
        assert ids[0, 6:30, 0].unique().tolist() == [10]
        assert ids[0, 30:, 0].unique().tolist() == [20]
        text = torch.stack(embeds.text_embeds)
        out = model.model(hidden_states=tokens, encoder_hidden_states=text, timestep=t / 1000,
                          guidance=torch.ones(2), txt_ids=Pipe._prepare_text_ids(text),
                          img_ids=ids, return_dict=False)[0][:, :6]
        plain = model.get_noise_prediction(latents, t, embeds)
    assert torch.allclose(ours, out.permute(0, 2, 1).reshape(2, 16, 2, 3), atol=1e-5)
    assert not torch.allclose(ours, plain, atol=1e-4)
    # Without controls: text to image, the latents as they are.
    assert model.condition_noisy_latents(latents, DataBatch(captions=["a"])) is latents


def test_reference_size_caps_at_one_megapixel_or_matches_the_target(flux2_dir: Path):
    model = loaded_model(flux2_dir)
    assert model.reference_size((512, 768), (64, 64)) == (512, 768)  # under 1 MP: kept
    assert model.reference_size((32, 48), (64, 64)) == (64, 96)  # raised to the 64 px floor
    h, w = model.reference_size((2048, 2048), (64, 64))
    assert (h, w) == (1024, 1024)
    matched = loaded_model(flux2_dir, model_kwargs={"match_target_res": True})
    # 64 x 96 px is 6144 px: a square reference at that area is 78 px, 64 on the grid.
    assert matched.reference_size((512, 512), (64, 96)) == (64, 64)
    assert all(s % 16 == 0 for s in matched.reference_size((300, 500), (256, 256)))


def test_training_feeds_cfg_scale_to_the_guidance_embedding(flux2_dir: Path):
    model = loaded_model(flux2_dir)
    latents = torch.randn(1, 16, 2, 2, generator=torch.Generator().manual_seed(1))
    embeds = model.get_prompt_embeds(["a red circle"])
    with torch.no_grad():
        one = model.get_noise_prediction(latents, torch.tensor([500.0]), embeds)
        model.configure_training(SimpleNamespace(timestep_type="shift", cfg_scale=4.0))
        four = model.get_noise_prediction(latents, torch.tensor([500.0]), embeds)
    assert model.training_guidance() == 4.0 and not torch.allclose(one, four)


def test_training_shift_is_the_pipelines_empirical_mu(flux2_dir: Path):
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    model = loaded_model(flux2_dir)
    shift = model.training_schedule.shift
    assert shift.dynamic and shift.exponential
    assert shift.mu(1024) == pytest.approx(compute_empirical_mu(1024, 50))
    assert model.get_bucket_divisibility() == 16


def test_gradient_checkpointing_gives_the_same_lora_gradients(flux2_dir: Path):
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(flux2_dir), edit_batch,
                                                  reached=more_than_half)


def test_quantized_transformer_trains_only_the_lora(flux2_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(flux2_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model)
    assert not is_quantized(model.model.time_guidance_embed)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, edit_batch(model, 1))


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, flux2_dir: Path, hub_offline,
                                           capsys):
    hub_id = "black-forest-labs/FLUX.2-dev"
    path = flux2_job(tmp_path, flux2_dir, model={"arch": "flux2", "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys,
                                      says=("hub id", "huggingface-cli download"))
