"""The FLUX.2 [klein] archs on a tiny random model built locally: build and load, train
with LoRA, preview, Ctrl+C and exact resume, the LoRA layouts, interop with diffusers'
Flux2KleinPipeline (`load_lora_weights` on the saved file gives the trainer's own
preview), gradient checkpointing, the BatchNorm latent normalisation, the time shift and
the offline hub error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.errors import AdapterKeyError
from aitk.models.base import GenerateImageConfig
from aitk.models.catalog import size_multiple
from aitk.models.flux2_klein import lora_keys
from aitk.models.flux2_klein.model import Flux2Klein4BModel, Flux2KleinModel, run_pipeline
from aitk.models.registry import discover
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    image_array,
    load_tiny,
    more_than_half,
    run_to_the_end,
    tiny_model_folder,
    unseeded_batch,
    write_flow_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    arch_pipeline_render,
    float32_pipeline,
    interop_preview,
    trainer_preview,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

ARCH = "flux2_klein_4b"
klein_dir = tiny_model_folder(Flux2Klein4BModel)


def klein_job(tmp: Path, model_dir: Path, name: str = "k", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, ARCH, model_dir, "shift", 2.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, klein_dir: Path) -> Path:
    return run_to_the_end(klein_job(tmp_path_factory.mktemp("klein-run"), klein_dir))


def loaded_model(model_dir: Path, **cfg) -> Flux2KleinModel:
    return load_tiny(Flux2Klein4BModel, model_dir, **cfg)


def test_archs_resolve_to_the_klein_class():
    registry = discover(include_repo_extensions=False)
    for arch in ("flux2_klein_4b", "flux2_klein_9b", "flux2_klein"):
        cls = registry.get(arch)
        assert issubclass(cls, Flux2KleinModel) and cls.arch == arch


def test_trains_previews_and_writes_the_kohya_bfl_layout(trained: Path):
    lora = trained / "k.safetensors"
    weights = load_file(lora)
    assert weights and all(k.startswith(("lora_unet_double_blocks_0_",
                                         "lora_unet_single_blocks_0_")) for k in weights)
    alphas = {k: float(v) for k, v in weights.items() if k.endswith(".alpha")}
    # 12 modules: q, k, v of each stream fused into one qkv (rank 12, alpha 3 x 8).
    assert len(alphas) == 10
    assert alphas["lora_unet_double_blocks_0_img_attn_qkv.alpha"] == 24.0
    assert weights["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"].shape[0] == 12
    assert alphas["lora_unet_single_blocks_0_linear1.alpha"] == 8.0
    ups = [v for k, v in weights.items() if k.endswith("lora_up.weight")]
    assert all(torch.isfinite(v).all() for v in ups)
    assert any(v.abs().max() > 0 for v in ups)  # trained: the up matrices left zero-init
    with safe_open(str(lora), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == ARCH
    assert (trained / "samples" / f"{STEPS:09d}_0.png").exists()


def _delta(parts: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    down, up = parts[module + ".lora_A.weight"], parts[module + ".lora_B.weight"]
    alpha = float(parts.get(module + ".alpha", down.shape[0]))
    return up @ down * alpha / down.shape[0]


def test_lora_layouts_round_trip_and_upstream_files_read_exactly():
    gen = torch.Generator().manual_seed(0)
    internal: dict[str, torch.Tensor] = {}
    block = "transformer_blocks.0."
    names = [*(block + n for n in lora_keys.DOUBLE),
             *("single_transformer_blocks.0." + n for n in lora_keys.SINGLE)]
    for i, name in enumerate(names):
        internal[name + ".lora_A.weight"] = torch.randn(4, 8, generator=gen)
        internal[name + ".lora_B.weight"] = torch.randn(6, 4, generator=gen)
        internal[name + ".alpha"] = torch.tensor(8.0 if i != 1 else 2.0)  # k: other alpha
    back = lora_keys.from_file(lora_keys.to_file(internal))
    assert back.keys() == internal.keys()
    for name in names:  # the same deltas (k's alpha difference moved into its up)
        assert torch.allclose(_delta(back, name), _delta(internal, name), atol=1e-6)

    # upstream ai-toolkit: `diffusion_model.` + BFL names, one down for the fused qkv,
    # no alpha (alpha = rank, as diffusers reads it).
    down, up = torch.randn(4, 8, generator=gen), torch.randn(18, 4, generator=gen)
    upstream = {"diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight": down,
                "diffusion_model.double_blocks.0.img_attn.qkv.lora_B.weight": up}
    read = lora_keys.from_file(upstream)
    for slot, name in enumerate(("attn.to_q", "attn.to_k", "attn.to_v")):
        want = (up @ down)[slot * 6:(slot + 1) * 6]
        assert torch.allclose(_delta(read, block + name), want, atol=1e-6)
    # aitk's older layout (`diffusion_model.` + diffusers names) still reads.
    older = {"diffusion_model." + k: v for k, v in internal.items()}
    assert lora_keys.from_file(older).keys() == internal.keys()
    with pytest.raises(AdapterKeyError):
        lora_keys.to_file({k: v for k, v in internal.items() if ".to_k." not in k})


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, klein_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(klein_job(tmp_path, klein_dir), trained, monkeypatch)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(klein_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    from diffusers import Flux2KleinPipeline

    lora = amplified(trained / "k.safetensors", tmp_path / "strong.safetensors")
    # guidance 2 on a base (not distilled) model: true CFG against the negative prompt.
    gen = interop_preview()
    ours, embeds = trainer_preview(loaded_model(klein_dir), lora, gen)
    pipe = float32_pipeline(Flux2KleinPipeline, klein_dir)
    # The pipeline's own prompt encoding (chat template, layers 9/18/27) is ours.
    theirs_embeds = pipe.encode_prompt(gen.prompt, max_sequence_length=64)[0][0]
    assert torch.allclose(theirs_embeds, embeds[gen.prompt].text_embeds[0], atol=1e-5)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""])
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


def test_batchnorm_normalisation_round_trips_the_vae_path(klein_dir: Path):
    from diffusers import Flux2KleinPipeline

    model = loaded_model(klein_dir)
    pixels = torch.rand(2, 3, 32, 48, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = model.encode_images(pixels)
    assert latents.shape == (2, 16, 2, 3)
    pipe = Flux2KleinPipeline(scheduler=model.noise_scheduler, vae=model.vae,
                              text_encoder=None, tokenizer=None, transformer=model.model)
    with torch.no_grad():
        assert torch.allclose(latents, pipe._encode_vae_image(pixels, None), atol=1e-6)
        raw = model.vae.encode(pixels).latent_dist.mode()
        direct = model.vae.decode(raw).sample
    # The statistics are not the identity, so the normalisation really happened ...
    assert (latents - Flux2KleinPipeline._patchify_latents(raw)).abs().max() > 0.1
    # ... and decoding undoes it: the same image as the VAE's own encode -> decode.
    assert torch.allclose(model.decode_latents(latents), direct, atol=1e-5)


def test_training_forward_is_the_pipelines_transformer_call(klein_dir: Path):
    """Packing, the 4-axis ids (image (0, h, w, 0), text (0, 0, 0, l)) and unpacking
    agree with Flux2KleinPipeline's own preparation of the same latents."""
    from diffusers import Flux2KleinPipeline as Pipe

    model = loaded_model(klein_dir)
    gen = torch.Generator().manual_seed(2)
    latents = torch.randn(2, 16, 2, 3, generator=gen)
    embeds = model.get_prompt_embeds(["a red circle", "blue"])
    t = torch.tensor([250.0, 800.0])
    with torch.no_grad():
        ours = model.get_noise_prediction(latents, t, embeds)
        text = torch.stack(embeds.text_embeds)
        ids = Pipe._prepare_latent_ids(latents)
        out = model.model(hidden_states=Pipe._pack_latents(latents), timestep=t / 1000,
                          guidance=None, encoder_hidden_states=text,
                          txt_ids=Pipe._prepare_text_ids(text), img_ids=ids,
                          return_dict=False)[0]
    assert torch.allclose(ours, Pipe._unpack_latents_with_ids(out, ids, 2, 3), atol=1e-6)
    text_ids = Pipe._prepare_text_ids(text)[0]
    assert text_ids.shape == (text.shape[1], 4) and text_ids[:, 3].tolist() == list(
        range(text.shape[1]))


def test_text_layers_past_the_deepest_one_read_are_dropped(klein_dir: Path):
    from transformers import Qwen3Model

    model = loaded_model(klein_dir, model_kwargs={"text_encoder_out_layers": [2, 5, 9]})
    assert len(model.text_encoder.layers) == 10
    embeds = model.get_prompt_embeds(["a red circle"]).text_embeds[0]
    full = Qwen3Model.from_pretrained(klein_dir / "text_encoder")
    assert len(full.layers) == 28
    text = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "a red circle"}], tokenize=False,
        add_generation_prompt=True, enable_thinking=False)
    tokens = model.tokenizer([text], padding="max_length", max_length=64,
                             return_tensors="pt")
    with torch.no_grad():
        hidden = full(**tokens, output_hidden_states=True).hidden_states
    want = torch.cat([hidden[k][0] for k in (2, 5, 9)], dim=-1)
    assert torch.allclose(embeds, want, atol=1e-5)


def test_lokr_files_round_trip(klein_dir: Path, tmp_path: Path):
    model = loaded_model(klein_dir)
    network = AdapterNetwork.attach(model, NetCfg(type="lokr", linear=4, linear_alpha=2.0))
    with torch.no_grad():
        for p in network.trainable_parameters():
            p.normal_(0.0, 0.1)
    before = network.state_dict()
    network.save_file(tmp_path / "lokr.safetensors")
    assert all(k.startswith("diffusion_model.") for k in load_file(tmp_path / "lokr.safetensors"))
    with torch.no_grad():
        for p in network.trainable_parameters():
            p.zero_()
    network.load_file(tmp_path / "lokr.safetensors")
    after = network.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_gradient_checkpointing_gives_the_same_lora_gradients(klein_dir: Path):
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(klein_dir), unseeded_batch,
                                                  reached=more_than_half)


def test_quantized_transformer_trains_only_the_lora(klein_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(klein_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model)
    assert not is_quantized(model.model.proj_out) and not is_quantized(model.model.x_embedder)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, unseeded_batch(model, 1))


def test_training_shift_is_the_pipelines_empirical_mu(klein_dir: Path):
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    model = loaded_model(klein_dir)
    assert model.get_bucket_divisibility() == 16 and not model.is_distilled
    # The config preflight (dataset audit) buckets with the same cell.
    assert all(size_multiple(a) == 16 for a in ("flux2_klein_4b", "flux2_klein_9b"))
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    shift = model.training_schedule.shift
    assert shift.dynamic and shift.exponential
    assert shift.mu(1024) == pytest.approx(compute_empirical_mu(1024, 50))
    distilled = loaded_model(klein_dir, model_kwargs={"is_distilled": True})
    distilled.configure_training(SimpleNamespace(timestep_type="shift"))
    assert distilled.training_schedule.shift.mu(1024) == pytest.approx(
        compute_empirical_mu(1024, 4))
    # 1024 tokens at 50 steps: s = 0.5 moves to e^mu / (e^mu + 1).
    s = model.training_schedule.shift.apply(torch.tensor([0.5]), 1024)
    mu = compute_empirical_mu(1024, 50)
    assert float(s) == pytest.approx(np.exp(mu) / (np.exp(mu) + 1.0))


def test_a_distilled_folder_samples_without_true_cfg(klein_dir: Path, tmp_path: Path):
    import json
    import shutil

    folder = tmp_path / "distilled"
    shutil.copytree(klein_dir, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    model = loaded_model(folder)
    assert model.is_distilled and model.get_generation_pipeline().config.is_distilled
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=32, sample_steps=2,
                              seed=5, guidance_scale=4.0)
    embeds = model.encode_prompts([gen.prompt, "", "blurry"])
    # Guidance is ignored: the negative prompt changes nothing.
    first = image_array(model.generate_images([gen], embeds)[0])
    gen.negative_prompt = "blurry"
    assert np.array_equal(first, image_array(model.generate_images([gen], embeds)[0]))


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, klein_dir: Path, hub_offline,
                                           capsys):
    hub_id = "black-forest-labs/FLUX.2-klein-base-4B"
    path = klein_job(tmp_path, klein_dir, model={"arch": ARCH, "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys,
                                      says=("hub id", "huggingface-cli download"))

