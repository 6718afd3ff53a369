"""The `hidream` arch (HiDream-I1 Full, Dev, Fast) on a tiny random model built locally:
load, the four text encoders as HiDreamImagePipeline encodes them, train with LoRA,
preview, Ctrl+C and exact resume, checkpointing, quantization, offline hub id, and
interop: diffusers' `load_lora_weights` on the same tiny pipeline gives the trainer's
own preview, and every key is one ComfyUI's HiDream loader maps (comfy/lora.py:
`transformer.` + its model's weight names, comfy/ldm/hidream/model.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.models.base import GenerateImageConfig
from aitk.models.hidream.model import HiDreamModel, keep_sample_size
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_loaded_lora_reproduces,
    assert_same_weights,
    image_array,
    interrupt_via_sigint_then_resume,
    last_step_sample,
    model_cfg,
    randomise,
    step_grads_without_and_with_checkpointing,
    tiny_model_folder,
    train_cfg,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

hidream_dir = tiny_model_folder(HiDreamModel, scope="session")
NO_EXPERTS = {"ignore_if_contains": ["ff_i.experts", "ff_i.gate"]}  # upstream's UI default


def hidream_job(tmp: Path, model_dir: Path, name: str = "h", **overrides: Any) -> Path:
    settings = dict(
        network={"type": "lora", "linear": 4, "linear_alpha": ALPHA},
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3, "timestep_type": "shift"},
        sample=last_step_sample(guidance_scale=3.0),
    )
    return write_lora_job(tmp, name, "hidream", model_dir, **{**settings, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, hidream_dir: Path) -> Path:
    tmp = tmp_path_factory.mktemp("hidream-run")
    assert cli_main([str(hidream_job(tmp, hidream_dir))]) == 0
    return tmp / "out" / "h"


def loaded_model(model_dir: Path, **cfg: Any) -> HiDreamModel:
    model = HiDreamModel(model_cfg("hidream", model_dir, **cfg))
    model.load_model()
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
    interrupt_via_sigint_then_resume([str(hidream_job(tmp_path, hidream_dir))], monkeypatch)
    assert_same_weights(tmp_path / "out" / "h" / "h.safetensors", trained / "h.safetensors")


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
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=ALPHA))
    network.load_file(lora)
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=32, sample_steps=2,
                              seed=5, guidance_scale=3.0)
    embeds = model.encode_prompts([gen.prompt, ""])
    ours = image_array(model.generate_images([gen], embeds)[0])

    pipe = HiDreamImagePipeline.from_pretrained(hidream_dir)
    pipe.set_progress_bar_config(disable=True)
    keep_sample_size(pipe, 32, 32)  # the pipeline otherwise renders at 1024 x 1024
    kwargs = model.pipeline_embeds(embeds[gen.prompt], embeds[""])

    def theirs() -> np.ndarray:
        out = pipe(**kwargs, width=32, height=32, num_inference_steps=2, guidance_scale=3.0,
                   generator=torch.Generator().manual_seed(gen.seed))
        return image_array(out.images[0])

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
    from aitk.data.batch import DataBatch

    model = loaded_model(hidream_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0,
                                                  network_kwargs=NO_EXPERTS))
    params = list(network.trainable_parameters())
    randomise(network, scale=0.05)
    batch = DataBatch(captions=["a", "b"],
                      latents=model.encode_images(torch.rand(2, 3, 32, 48) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))
    plain, checkpointed = step_grads_without_and_with_checkpointing(model, params, batch)
    assert any(g.abs().max() > 0 for g in plain)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8"])
def test_quantized_transformer_trains_only_the_lora(hidream_dir: Path, qtype: str) -> None:
    from aitk.data.batch import DataBatch
    from aitk.models.quantize import is_quantized

    model = loaded_model(hidream_dir, quantize=True, qtype=qtype, quantize_te=True)
    tr = model.model
    assert is_quantized(tr.double_stream_blocks[0].block.attn1.to_q)
    assert is_quantized(model.text_encoder_4) and is_quantized(model.text_encoder_3)
    for kept in (tr.x_embedder.proj, tr.final_layer.linear, tr.caption_projection[0].linear,
                 tr.t_embedder.timestep_embedder.linear_1):
        assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg(network_kwargs=NO_EXPERTS))
    batch = DataBatch(captions=["a"],
                      latents=model.encode_images(torch.rand(1, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle"]))
    assert_a_step_reaches_only_the_lora(model, network, batch)


def test_bf16_model_previews_through_the_float32_vae(hidream_dir: Path) -> None:
    model = HiDreamModel(model_cfg("hidream", hidream_dir), dtype=torch.bfloat16)
    model.load_model()
    assert model.vae.dtype == torch.float32 and model.model.dtype == torch.bfloat16
    [image] = model.generate_images([GenerateImageConfig("a red circle", width=32,
                                                         height=48, sample_steps=2)])
    assert image.size == (32, 48)


# ---- loading errors -----------------------------------------------------------------------------
def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, hidream_dir: Path, hub_offline,
                                           capsys) -> None:
    repo = "HiDream-ai/HiDream-I1-Full"
    path = hidream_job(tmp_path, hidream_dir, model={"arch": "hidream", "name_or_path": repo})
    assert cli_main([str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and repo in err[0] and "Traceback" not in err[0]
    assert "hub id" in err[0]
