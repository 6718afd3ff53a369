"""The `lumina2` arch (Lumina-Image 2.0) on tiny random models built locally: load, the
text Lumina2Pipeline encodes, Lumina's reversed time, train with LoRA, preview, Ctrl+C
and exact resume, checkpointing, quantization, offline hub id, and interop: diffusers'
`load_lora_weights` on the same tiny pipeline (at Lumina 2's attention width, where its
converter splits the fused qkv) gives the trainer's own preview, and every key is a
weight of ComfyUI's Lumina 2 model (comfy/ldm/lumina/model.py NextDiT) under its
generic `diffusion_model.` rule (comfy/lora.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.models.lumina2.model import SYSTEM_PROMPT, Lumina2Model, pipeline_embeds
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    assert_reads_back,
    assert_same_weights,
    image_array,
    interrupt_via_sigint_then_resume,
    load_tiny,
    randomise,
    run_to_the_end,
    small_random_factors,
    tiny_model_folder,
    train_cfg,
    unseeded_batch,
    with_alpha_keys,
    write_flow_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    assert_bf16_previews_through_the_float32_vae,
    interop_preview,
    pipeline_render,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

lumina_dir = tiny_model_folder(Lumina2Model, scope="session")


@pytest.fixture(scope="session")
def interop_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aitk.models.lumina2.tiny import Lumina2Sizes, build_tiny_lumina2

    return build_tiny_lumina2(tmp_path_factory.mktemp("lumina2-wide") / "model",
                              sizes=Lumina2Sizes.interop())


def lumina_job(tmp: Path, model_dir: Path, name: str = "l", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "lumina2", model_dir, "lumina2_shift", 3.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, lumina_dir: Path) -> Path:
    return run_to_the_end(lumina_job(tmp_path_factory.mktemp("lumina2-run"), lumina_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> Lumina2Model:
    model = load_tiny(Lumina2Model, model_dir, **cfg)
    model.configure_training(train_cfg(timestep_type="lumina2_shift"))
    return model


# ---- load, text, time -------------------------------------------------------------------
def test_text_embeds_are_what_the_lumina2_pipeline_encodes(lumina_dir: Path) -> None:
    """System prompt + ' <Prompt Start> ' + prompt through Gemma, penultimate states;
    per item the tokens of the pipeline's mask, in order."""
    from diffusers import Lumina2Pipeline

    model = loaded_model(lumina_dir)
    prompts = ["a red square on grey", "cat"]
    embeds = model.get_prompt_embeds(prompts)
    pipe = Lumina2Pipeline.from_pretrained(lumina_dir, transformer=None, vae=None)
    assert pipe.system_prompt == SYSTEM_PROMPT
    text, mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False,
                                          max_sequence_length=model.max_sequence_length)
    for i, item in enumerate(embeds.text_embeds):
        assert item.shape == (int(mask[i].sum()), 32)
        assert torch.equal(item, text[i][mask[i].bool()].detach())
    assert (embeds.text_embeds[0].shape[0] - embeds.text_embeds[1].shape[0]
            == len(prompts[0]) - len(prompts[1]))  # ByT5: a token per byte


def test_system_prompt_and_token_limit_are_knobs(lumina_dir: Path) -> None:
    model = loaded_model(lumina_dir, model_kwargs={"system_prompt": "Draw.",
                                                   "max_sequence_length": 40})
    [short] = model.get_prompt_embeds(["a red circle"]).text_embeds
    assert short.shape[0] == len(b"Draw. <Prompt Start> a red circle") + 1  # ByT5's eos
    [cut] = model.get_prompt_embeds(["a red circle " * 10]).text_embeds
    assert cut.shape[0] == 40


def test_time_is_flipped_and_the_prediction_negated(lumina_dir: Path) -> None:
    """The API's t on 0..1000 (1000 = noise) is Lumina's 1 - t/1000 (1 = clean); the
    model's output points the other way from the velocity `noise - clean`."""
    model = loaded_model(lumina_dir)
    assert model.get_bucket_divisibility() == 16
    latents = model.encode_images(torch.rand(2, 3, 32, 48) * 2 - 1)
    embeds = model.get_prompt_embeds(["a", "bb"])
    seen = {}
    model.model.register_forward_hook(
        lambda m, a, kw, out: seen.update(t=kw["timestep"], out=out[0]), with_kwargs=True)
    with torch.no_grad():
        pred = model.get_noise_prediction(latents, torch.tensor([250.0, 800.0]), embeds)
    assert torch.allclose(seen["t"], torch.tensor([0.75, 0.2]))
    assert torch.equal(pred, -seen["out"]) and pred.shape == latents.shape


def test_schedule_is_the_schedulers_shift(lumina_dir: Path) -> None:
    schedule = loaded_model(lumina_dir).training_schedule
    assert not schedule.shift.dynamic and schedule.shift.shift == 6.0
    gen = torch.Generator().manual_seed(0)
    t = schedule.sample_timesteps(torch.zeros(512, 4, 8, 8), gen)
    assert t.median() > 700  # shift 6 pushes the uniform draws toward noise


# ---- the job end to end -----------------------------------------------------------------
def test_job_trains_into_the_authors_layout_and_previews(trained: Path) -> None:
    weights = load_file(trained / "l.safetensors")
    assert weights and all(k.startswith("diffusion_model.") for k in weights)
    assert not any(k.endswith(".alpha") for k in weights)  # folded into lora_B
    assert "diffusion_model.layers.0.attention.qkv.lora_B.weight" in weights
    ups = [v for k, v in weights.items() if k.endswith(".lora_B.weight")]
    assert ups and any(v.abs().max() > 0 for v in ups)
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, lumina_dir: Path,
                                                            trained: Path, monkeypatch) -> None:
    interrupt_via_sigint_then_resume([str(lumina_job(tmp_path, lumina_dir))], monkeypatch)
    assert_same_weights(tmp_path / "out" / "l" / "l.safetensors", trained / "l.safetensors")


# ---- LoRA files -------------------------------------------------------------------------------
def test_fused_qkv_holds_the_three_deltas_and_reads_back_exactly(lumina_dir: Path,
                                                                 tmp_path: Path) -> None:
    model = loaded_model(lumina_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=ALPHA))
    randomise(network)
    internal = {k: v.clone() for k, v in network.state_dict().items()}
    network.save_file(tmp_path / "l.safetensors", dtype=torch.float32)
    saved = load_file(tmp_path / "l.safetensors")
    stem = "diffusion_model.layers.1.attention.qkv"
    fused = saved[f"{stem}.lora_B.weight"] @ saved[f"{stem}.lora_A.weight"]
    deltas = [internal[f"layers.1.attn.{n}.lora_B.weight"]
              @ internal[f"layers.1.attn.{n}.lora_A.weight"] * ALPHA / 4
              for n in ("to_q", "to_k", "to_v")]
    assert torch.allclose(fused, torch.cat(deltas), atol=1e-6)
    assert fused.shape[0] == sum(model.qkv_rows) == 32 + 16 + 16  # grouped k/v heads
    assert_reads_back(network, tmp_path / "l.safetensors", internal, seed=7)
    # diffusers-named files, with `.alpha` (aitk's older layout, other trainers), read too.
    save_file(with_alpha_keys(internal, "transformer."), str(tmp_path / "old.safetensors"))
    assert_reads_back(network, tmp_path / "old.safetensors", internal, seed=8)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(interop_dir: Path,
                                                                     tmp_path: Path) -> None:
    """At Lumina 2's attention width diffusers converts the authors' layout (fused qkv
    split at 2304/768/768) and renders the trainer's preview."""
    from diffusers import Lumina2Pipeline

    model = loaded_model(interop_dir)
    assert model.qkv_rows == (2304, 768, 768)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=ALPHA))
    randomise(network, scale=0.05)
    lora = tmp_path / "l.safetensors"
    network.save_file(lora, dtype=torch.float32)
    gen = interop_preview(sample_steps=2, guidance_scale=3.0)
    embeds = model.encode_prompts([gen.prompt, ""])
    ours = image_array(model.generate_images([gen], embeds)[0])

    pipe = Lumina2Pipeline.from_pretrained(interop_dir)
    pipe.set_progress_bar_config(disable=True)
    theirs = pipeline_render(pipe, gen, **pipeline_embeds(
        embeds[gen.prompt], embeds[""], torch.device("cpu"), torch.float32))
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


# ComfyUI's Lumina 2 model (NextDiT, the authors' code) per block: the weight a
# `diffusion_model.<block>.<name>` LoRA key patches, and its rows (q, k and v fused).
def comfy_weights(hidden: int, q_rows: int, kv_rows: int, ffn: int, modulated: bool
                  ) -> dict[str, tuple[int, int]]:
    table = {"attention.qkv": (q_rows + 2 * kv_rows, hidden),
             "attention.out": (hidden, q_rows),
             "feed_forward.w1": (ffn, hidden), "feed_forward.w2": (hidden, ffn),
             "feed_forward.w3": (ffn, hidden)}
    if modulated:  # Sequential(SiLU, Linear(min(dim, 1024), 4 * dim))
        table["adaLN_modulation.1"] = (4 * hidden, min(hidden, 1024))
    return table


def test_file_keys_are_weights_of_comfyuis_lumina2_model(trained: Path,
                                                         lumina_dir: Path) -> None:
    """Every key is `diffusion_model.` + one of ComfyUI's NextDiT weights (its generic
    rule: the state-dict name without `.weight`), with that weight's shape as up @ down;
    every adapted weight of every block is there."""
    model = loaded_model(lumina_dir)
    tr = model.model
    hidden = tr.config.hidden_size
    q_rows, kv_rows, _ = model.qkv_rows
    ffn = tr.layers[0].feed_forward.linear_1.out_features
    expected = {}
    for kind, count, modulated in (("layers", len(tr.layers), True),
                                   ("noise_refiner", len(tr.noise_refiner), True),
                                   ("context_refiner", len(tr.context_refiner), False)):
        for i in range(count):
            for name, shape in comfy_weights(hidden, q_rows, kv_rows, ffn, modulated).items():
                expected[f"diffusion_model.{kind}.{i}.{name}"] = shape
    weights = load_file(trained / "l.safetensors")
    modules = {k.rsplit(".lora_", 1)[0] for k in weights}
    assert modules == set(expected)
    for module in modules:
        delta = weights[f"{module}.lora_B.weight"] @ weights[f"{module}.lora_A.weight"]
        assert tuple(delta.shape) == expected[module], module


# ---- memory -------------------------------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_lora_gradients(lumina_dir: Path) -> None:
    assert_checkpointing_keeps_the_lora_gradients(
        loaded_model(lumina_dir), unseeded_batch, reached=any, init=small_random_factors)


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8"])
def test_quantized_transformer_trains_only_the_lora(lumina_dir: Path, qtype: str) -> None:
    from aitk.models.quantize import is_quantized

    model = loaded_model(lumina_dir, quantize=True, qtype=qtype, quantize_te=True)
    tr = model.model
    assert is_quantized(tr.layers[0].attn.to_q) and is_quantized(model.text_encoder)
    for kept in (tr.x_embedder, tr.norm_out.linear_1,
                 tr.time_caption_embed.timestep_embedder.linear_1):
        assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, unseeded_batch(model, 1))


def test_bf16_model_previews_through_the_float32_vae(lumina_dir: Path) -> None:
    assert_bf16_previews_through_the_float32_vae(Lumina2Model, lumina_dir)


# ---- loading errors -----------------------------------------------------------------------------
def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, lumina_dir: Path, hub_offline,
                                           capsys) -> None:
    repo = "Alpha-VLLM/Lumina-Image-2.0"
    path = lumina_job(tmp_path, lumina_dir, model={"arch": "lumina2", "name_or_path": repo})
    assert_hub_id_offline_is_one_line(path, repo, capsys, says=("hub id",))
