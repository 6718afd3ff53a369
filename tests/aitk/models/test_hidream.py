"""The `hidream` arch (HiDream-I1 Full, Dev, Fast) on a tiny random model built locally:
load, the four text encoders as HiDreamImagePipeline encodes them, train with LoRA,
preview, Ctrl+C and exact resume, checkpointing, quantization, offline hub id, and
interop: diffusers' `load_lora_weights` on the same tiny pipeline gives the trainer's
own preview, and every key is one ComfyUI's HiDream loader maps (comfy/lora.py:
`transformer.` + its model's weight names, comfy/ldm/hidream/model.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.models.hidream.model import HiDreamModel, keep_sample_size
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    load_tiny,
    run_to_the_end,
    small_random_factors,
    tiny_model_folder,
    train_cfg,
    unseeded_batch,
    write_flow_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    assert_bf16_previews_through_the_float32_vae,
    interop_preview,
    pipeline_render,
    trainer_preview,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

hidream_dir = tiny_model_folder(HiDreamModel, scope="session")
NO_EXPERTS = {"ignore_if_contains": ["ff_i.experts", "ff_i.gate"]}  # upstream's UI default


def hidream_job(tmp: Path, model_dir: Path, name: str = "h", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "hidream", model_dir, "shift", 3.0,
                          **{"network": {"type": "lora", "linear": 4, "linear_alpha": ALPHA},
                             **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, hidream_dir: Path) -> Path:
    return run_to_the_end(hidream_job(tmp_path_factory.mktemp("hidream-run"), hidream_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> HiDreamModel:
    model = load_tiny(HiDreamModel, model_dir, **cfg)
    model.configure_training(train_cfg(timestep_type="shift"))
    return model


# ---- load, text, time -------------------------------------------------------------------
def test_text_embeds_are_what_the_hidream_pipeline_encodes(hidream_dir: Path) -> None:
    """T5 states, the Llama layers the transformer reads, both CLIPs' pooled outputs:
    HiDreamImagePipeline.encode_prompt's own, item by item."""
    from diffusers import HiDreamImagePipeline

    model = loaded_model(hidream_dir)
    prompts = ["a red square on grey", "cat"]
    embeds = model.get_prompt_embeds(prompts)
    pipe = HiDreamImagePipeline.from_pretrained(hidream_dir, transformer=None, vae=None)
    t5, _, llama, _, pooled, _ = pipe.encode_prompt(
        prompts, prompts, prompts, prompts, do_classifier_free_guidance=False,
        max_sequence_length=model.max_sequence_length)
    assert [tuple(t.shape) for t in embeds.text_embeds] == [(128, 32)] * 2
    assert torch.allclose(torch.stack(embeds.text_embeds), t5.detach(), atol=1e-5)
    assert torch.equal(torch.cat(embeds.pooled_embeds), pooled.detach())
    stacked = model.llama_stack(torch.stack(embeds["llama_embeds"]))
    for k in model.model.config.llama_layers:
        assert torch.allclose(stacked[k], llama[k].detach(), atol=1e-5)


def test_timesteps_go_in_as_they_are_and_the_prediction_is_negated(hidream_dir: Path
                                                                   ) -> None:
    model = loaded_model(hidream_dir)
    assert model.get_bucket_divisibility() == 16
    latents = model.encode_images(torch.rand(2, 3, 32, 48) * 2 - 1)
    embeds = model.get_prompt_embeds(["a", "b"])
    seen = {}
    model.model.register_forward_hook(
        lambda m, a, kw, out: seen.update(t=kw["timesteps"], out=out[0]), with_kwargs=True)
    with torch.no_grad():
        pred = model.get_noise_prediction(latents, torch.tensor([250.0, 800.0]), embeds)
    assert torch.equal(seen["t"], torch.tensor([250.0, 800.0]))
    assert torch.equal(pred, -seen["out"]) and pred.shape == latents.shape


@pytest.mark.parametrize("size", [(32, 32), (32, 48)])
def test_train_and_eval_mode_give_one_prediction(hidream_dir: Path, size) -> None:
    """diffusers hands back the patch layout in train mode (and pads a non-square image
    to its token budget): the prediction is the same image-shaped tensor either way."""
    model = loaded_model(hidream_dir)
    latents = model.encode_images(torch.rand(2, 3, *size) * 2 - 1)
    embeds = model.get_prompt_embeds(["a red circle", "b"])
    t = torch.tensor([300.0, 700.0])
    with torch.no_grad():
        model.model.eval()
        eval_pred = model.get_noise_prediction(latents, t, embeds)
        model.model.train()
        train_pred = model.get_noise_prediction(latents, t, embeds)
    assert train_pred.shape == latents.shape
    assert torch.allclose(train_pred, eval_pred, atol=1e-5)


def test_schedule_and_token_knobs(hidream_dir: Path) -> None:
    model = loaded_model(hidream_dir, model_kwargs={"max_sequence_length": 16})
    assert not model.training_schedule.shift.dynamic
    assert model.training_schedule.shift.shift == 3.0
    embeds = model.get_prompt_embeds(["a long prompt about a red circle"])
    assert embeds.text_embeds[0].shape == (16, 32)
    assert embeds["llama_embeds"][0].shape == (16, 2 * 32)  # layers 0 and 1


def test_llama_loads_from_llama_model_path(hidream_dir: Path, tmp_path: Path) -> None:
    """The hub repos have no text_encoder_4: then model_kwargs.llama_model_path holds the
    Llama (a causal-LM folder, as the real repos are), loaded as its base model."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(hidream_dir, folder)
    llama = tmp_path / "llama"
    shutil.move(str(folder / "text_encoder_4"), str(llama))
    shutil.move(str(folder / "tokenizer_4"), str(llama / "tok"))
    for name in (llama / "tok").iterdir():
        shutil.move(str(name), str(llama / name.name))
    (llama / "tok").rmdir()
    model = loaded_model(folder, model_kwargs={"llama_model_path": str(llama)})
    ours = loaded_model(hidream_dir)
    a = model.get_prompt_embeds(["a red circle"])["llama_embeds"][0]
    assert torch.equal(a, ours.get_prompt_embeds(["a red circle"])["llama_embeds"][0])


# ---- the job end to end -----------------------------------------------------------------
def test_job_trains_and_previews(trained: Path) -> None:
    weights = load_file(trained / "h.safetensors")
    assert weights and all(k.startswith("transformer.") for k in weights)
    assert not any(k.endswith(".alpha") for k in weights)  # folded into lora_B
    ups = [v for k, v in weights.items() if k.endswith(".lora_B.weight")]
    assert ups and any(v.abs().max() > 0 for v in ups)
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, hidream_dir: Path,
                                                            trained: Path, monkeypatch) -> None:
    assert_ctrl_c_then_resume_matches(hidream_job(tmp_path, hidream_dir), trained,
                                      monkeypatch)


def test_upstreams_expert_exclusion_leaves_the_experts_alone(hidream_dir: Path,
                                                            tmp_path: Path) -> None:
    model = loaded_model(hidream_dir)
    network = AdapterNetwork.attach(model, NetCfg(network_kwargs=NO_EXPERTS))
    network.save_file(tmp_path / "l.safetensors")
    keys = load_file(tmp_path / "l.safetensors")
    assert not any(".ff_i.experts." in k for k in keys)
    assert any(".ff_i.shared_experts." in k for k in keys)


# ---- LoRA files -------------------------------------------------------------------------------
def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(hidream_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path) -> None:
    from diffusers import HiDreamImagePipeline

    lora = amplified(trained / "h.safetensors", tmp_path / "strong.safetensors")
    model = loaded_model(hidream_dir)
    gen = interop_preview(sample_steps=2, guidance_scale=3.0)
    ours, embeds = trainer_preview(model, lora, gen)
    pipe = HiDreamImagePipeline.from_pretrained(hidream_dir)
    pipe.set_progress_bar_config(disable=True)
    keep_sample_size(pipe, 32, 32)  # the pipeline otherwise renders at 1024 x 1024
    theirs = pipeline_render(pipe, gen, **model.pipeline_embeds(embeds[gen.prompt],
                                                                 embeds[""]))
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


# ComfyUI's HiDream model (comfy/ldm/hidream/model.py) per block: the Linear weights a
# `transformer.<block>.<name>` key patches (comfy/lora.py maps `transformer.` + each of
# its state-dict names). Double-stream blocks have a text stream (`_t`, ff_t); single
# ones do not. `e` marks the routed experts.
COMFY_DOUBLE = ("adaLN_modulation.1", "attn1.to_q", "attn1.to_k", "attn1.to_v",
                "attn1.to_out", "attn1.to_q_t", "attn1.to_k_t", "attn1.to_v_t",
                "attn1.to_out_t", "ff_i.shared_experts.w1", "ff_i.shared_experts.w2",
                "ff_i.shared_experts.w3", "ff_i.experts.e.w1", "ff_i.experts.e.w2",
                "ff_i.experts.e.w3", "ff_t.w1", "ff_t.w2", "ff_t.w3")
COMFY_SINGLE = tuple(n for n in COMFY_DOUBLE if not n.endswith("_t") and "ff_t" not in n)


def comfy_names(double: int, single: int, experts: int) -> set[str]:
    names = set()
    for kind, count, table in (("double_stream_blocks", double, COMFY_DOUBLE),
                               ("single_stream_blocks", single, COMFY_SINGLE)):
        for i in range(count):
            for name in table:
                for e in (range(experts) if ".e." in name else [None]):
                    full = name if e is None else name.replace(".e.", f".{e}.")
                    names.add(f"transformer.{kind}.{i}.block.{full}")
    return names


def test_file_keys_are_the_layout_comfyui_maps_for_hidream(trained: Path,
                                                           hidream_dir: Path) -> None:
    model = loaded_model(hidream_dir)
    cfg = model.model.config
    expected = comfy_names(cfg.num_layers, cfg.num_single_layers, cfg.num_routed_experts)
    weights = load_file(trained / "h.safetensors")
    modules = {k.rsplit(".lora_", 1)[0] for k in weights}
    assert modules == expected
    for module in modules:  # up @ down has the shape of the weight it patches
        delta = weights[f"{module}.lora_B.weight"] @ weights[f"{module}.lora_A.weight"]
        layer = model.model.get_submodule(module.removeprefix("transformer."))
        assert delta.shape == layer.weight.shape


# ---- memory -------------------------------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_lora_gradients(hidream_dir: Path) -> None:
    assert_checkpointing_keeps_the_lora_gradients(
        loaded_model(hidream_dir), lambda model: unseeded_batch(model, width=48),
        reached=any, init=small_random_factors, network_kwargs=NO_EXPERTS)


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8"])
def test_quantized_transformer_trains_only_the_lora(hidream_dir: Path, qtype: str) -> None:
    from aitk.models.quantize import is_quantized

    model = loaded_model(hidream_dir, quantize=True, qtype=qtype, quantize_te=True)
    tr = model.model
    assert is_quantized(tr.double_stream_blocks[0].block.attn1.to_q)
    assert is_quantized(model.text_encoder_4) and is_quantized(model.text_encoder_3)
    for kept in (tr.x_embedder.proj, tr.final_layer.linear, tr.caption_projection[0].linear,
                 tr.t_embedder.timestep_embedder.linear_1):
        assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg(network_kwargs=NO_EXPERTS))
    assert_a_step_reaches_only_the_lora(model, network, unseeded_batch(model, 1))


def test_bf16_model_previews_through_the_float32_vae(hidream_dir: Path) -> None:
    assert_bf16_previews_through_the_float32_vae(HiDreamModel, hidream_dir, height=48)


# ---- loading errors -----------------------------------------------------------------------------
def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, hidream_dir: Path, hub_offline,
                                           capsys) -> None:
    repo = "HiDream-ai/HiDream-I1-Full"
    path = hidream_job(tmp_path, hidream_dir, model={"arch": "hidream", "name_or_path": repo})
    assert_hub_id_offline_is_one_line(path, repo, capsys, says=("hub id",))
