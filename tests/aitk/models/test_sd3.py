"""The `sd3` arch (SD 3.5 medium and large) on a tiny random model built locally: load,
the text layout StableDiffusion3Pipeline encodes, train with LoRA, preview, Ctrl+C and
exact resume, checkpointing, quantization, offline hub id, and interop: diffusers'
`load_lora_weights` on the saved file gives the trainer's own preview, and every key
is one ComfyUI's SD3 loader maps (comfy/lora.py + comfy.utils.mmdit_to_diffusers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.adapters.alpha_folding import fold_alphas
from aitk.cli.run import main as cli_main
from aitk.models.base import GenerateImageConfig
from aitk.models.sd3.model import SD3Model
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

sd3_dir = tiny_model_folder(SD3Model, scope="session")


def sd3_job(tmp: Path, model_dir: Path, name: str = "s", **overrides: Any) -> Path:
    settings = dict(
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3, "timestep_type": "shift"},
        sample=last_step_sample(guidance_scale=3.0),
    )
    return write_lora_job(tmp, name, "sd3", model_dir, **{**settings, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, sd3_dir: Path) -> Path:
    tmp = tmp_path_factory.mktemp("sd3-run")
    assert cli_main([str(sd3_job(tmp, sd3_dir))]) == 0
    return tmp / "out" / "s"


def loaded_model(model_dir: Path, **cfg: Any) -> SD3Model:
    model = SD3Model(model_cfg("sd3", model_dir, **cfg))
    model.load_model()
    model.configure_training(train_cfg(timestep_type="shift"))
    return model


# ---- load, text, schedule ---------------------------------------------------------------
def test_text_embeds_are_what_the_sd3_pipeline_encodes(sd3_dir: Path) -> None:
    """Both CLIPs' penultimate states, zero-padded to T5's width, then T5's states; the
    pooled rows of both CLIPs: StableDiffusion3Pipeline.encode_prompt's own output."""
    from diffusers import StableDiffusion3Pipeline

    model = loaded_model(sd3_dir)
    embeds = model.get_prompt_embeds(["a red square on grey", "cat"])
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir, transformer=None, vae=None)
    text, _, pooled, _ = pipe.encode_prompt(
        ["a red square on grey", "cat"], None, None, do_classifier_free_guidance=False,
        max_sequence_length=model.max_sequence_length)
    assert [tuple(t.shape) for t in embeds.text_embeds] == [(77 + 32, 32)] * 2
    # Same encoders, same tokens; T5's float rounding differs by a few ulps.
    assert torch.allclose(torch.stack(embeds.text_embeds), text.detach(), atol=1e-5)
    assert torch.equal(torch.cat(embeds.pooled_embeds), pooled.detach())
    assert torch.equal(text[:, :77, 32:], torch.zeros_like(text[:, :77, 32:]))  # CLIP pad


def test_loads_latents_and_timesteps_go_in_as_they_are(sd3_dir: Path) -> None:
    model = loaded_model(sd3_dir)
    assert model.get_bucket_divisibility() == 16  # VAE 8 x patch 2
    assert not any(p.requires_grad for p in model.model.parameters())
    pixels = torch.rand(2, 3, 32, 48) * 2 - 1
    latents = model.encode_images(pixels)
    with torch.no_grad():
        mean = model.vae.encode(pixels).latent_dist.mean
    cfg = model.vae.config
    assert torch.allclose(latents, (mean - cfg.shift_factor) * cfg.scaling_factor)
    seen = {}
    model.model.register_forward_pre_hook(lambda m, a, kw: seen.update(t=kw["timestep"]),
                                          with_kwargs=True)
    with torch.no_grad():
        pred = model.get_noise_prediction(latents, torch.tensor([250.0, 800.0]),
                                          model.get_prompt_embeds(["a", "b"]))
    assert pred.shape == latents.shape
    assert torch.equal(seen["t"], torch.tensor([250.0, 800.0]))


def test_schedule_is_the_fixed_shift_of_the_scheduler(sd3_dir: Path) -> None:
    schedule = loaded_model(sd3_dir).training_schedule
    assert not schedule.shift.dynamic and schedule.shift.shift == 3.0
    s = torch.tensor([0.5])
    assert schedule.shift.apply(s, 0).item() == pytest.approx(0.75)  # 3s / (1 + 2s)


def test_max_sequence_length_sets_the_t5_tokens(sd3_dir: Path) -> None:
    model = loaded_model(sd3_dir, model_kwargs={"max_sequence_length": 8})
    [text] = model.get_prompt_embeds(["a long prompt about a red circle"]).text_embeds
    assert text.shape == (77 + 8, 32)


# ---- the job end to end ---------------------------------------------------------------------
def test_job_trains_and_previews(trained: Path) -> None:
    weights = load_file(trained / "s.safetensors")
    assert weights and all(k.startswith("transformer.transformer_blocks.") for k in weights)
    assert not any(k.endswith(".alpha") for k in weights)  # folded: see the next tests
    ups = [v for k, v in weights.items() if k.endswith(".lora_B.weight")]
    assert ups and any(v.abs().max() > 0 for v in ups)
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, sd3_dir: Path,
                                                            trained: Path, monkeypatch) -> None:
    interrupt_via_sigint_then_resume([str(sd3_job(tmp_path, sd3_dir))], monkeypatch)
    assert_same_weights(tmp_path / "out" / "s" / "s.safetensors", trained / "s.safetensors")


# ---- LoRA files -------------------------------------------------------------------------------
def test_alpha_is_folded_into_the_up_weights_and_read_back(sd3_dir: Path,
                                                           tmp_path: Path) -> None:
    """The file's B @ A is the trained delta B @ A * alpha / rank, so a reader without
    alpha (scale 1) applies it; loading the file gives back the adapter exactly."""
    model = loaded_model(sd3_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=ALPHA))
    randomise(network)
    internal = {k: v.clone() for k, v in network.state_dict().items()}
    network.save_file(tmp_path / "l.safetensors", dtype=torch.float32)
    saved = load_file(tmp_path / "l.safetensors")
    name = "transformer_blocks.0.attn.to_q"
    assert torch.allclose(saved[f"transformer.{name}.lora_B.weight"],
                          internal[f"{name}.lora_B.weight"] * ALPHA / 4)
    randomise(network, seed=7)
    network.load_file(tmp_path / "l.safetensors")
    assert all(torch.equal(network.state_dict()[k], v) for k, v in internal.items())
    # A file that carries `.alpha` (other trainers, `diffusion_model.` prefix) reads too.
    with_alpha = {f"diffusion_model.{k}": v for k, v in internal.items()}
    with_alpha.update({f"diffusion_model.{k.rsplit('.lora_', 1)[0]}.alpha":
                       torch.tensor(float(ALPHA)) for k in internal})
    save_file(with_alpha, str(tmp_path / "old.safetensors"))
    randomise(network, seed=8)
    network.load_file(tmp_path / "old.safetensors")
    assert all(torch.equal(network.state_dict()[k], v) for k, v in internal.items())
    lokr = {"m.lokr_w1": torch.ones(2, 2), "m.alpha": torch.tensor(2.0)}
    assert fold_alphas(lokr).keys() == lokr.keys()  # only LoRA modules fold


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(sd3_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path) -> None:
    from diffusers import StableDiffusion3Pipeline

    lora = amplified(trained / "s.safetensors", tmp_path / "strong.safetensors")
    model = loaded_model(sd3_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=ALPHA))
    network.load_file(lora)
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=32, sample_steps=3,
                              seed=5, guidance_scale=3.0)
    embeds = model.encode_prompts([gen.prompt, ""])
    ours = image_array(model.generate_images([gen], embeds)[0])

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.set_progress_bar_config(disable=True)
    cond, uncond = embeds[gen.prompt], embeds[""]

    def theirs() -> np.ndarray:
        out = pipe(prompt_embeds=cond.text_embeds[0][None],
                   pooled_prompt_embeds=cond.pooled_embeds[0],
                   negative_prompt_embeds=uncond.text_embeds[0][None],
                   negative_pooled_prompt_embeds=uncond.pooled_embeds[0], width=32,
                   height=32, num_inference_steps=3, guidance_scale=3.0,
                   generator=torch.Generator().manual_seed(gen.seed))
        return image_array(out.images[0])

    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


def test_bf16_model_previews_through_the_float32_vae(sd3_dir: Path) -> None:
    """The transformer and text encoders in bf16, the VAE in float32 (as loaded): the
    pipeline's latents are decoded by the model's own float32 decode."""
    model = SD3Model(model_cfg("sd3", sd3_dir), dtype=torch.bfloat16)
    model.load_model()
    assert model.vae.dtype == torch.float32 and model.model.dtype == torch.bfloat16
    [image] = model.generate_images([GenerateImageConfig("a red circle", width=32,
                                                         height=32, sample_steps=2)])
    assert image.size == (32, 32)


# ComfyUI's SD3 LoRA map (comfy/lora.py `model_lora_keys_unet`, SD3 branch): a key
# `transformer.<diffusers name>` targets the MMDiT weight comfy.utils.mmdit_to_diffusers
# pairs with `<diffusers name>.weight`, in joint block i. q/k/v are row slices of one
# fused qkv weight: (target, slice index 0/1/2); None: the whole weight.
COMFY_SD3_BLOCK: dict[str, tuple[str, int | None]] = {
    "attn.to_q": ("x_block.attn.qkv", 0),
    "attn.to_k": ("x_block.attn.qkv", 1),
    "attn.to_v": ("x_block.attn.qkv", 2),
    "attn.add_q_proj": ("context_block.attn.qkv", 0),
    "attn.add_k_proj": ("context_block.attn.qkv", 1),
    "attn.add_v_proj": ("context_block.attn.qkv", 2),
    "attn2.to_q": ("x_block.attn2.qkv", 0),
    "attn2.to_k": ("x_block.attn2.qkv", 1),
    "attn2.to_v": ("x_block.attn2.qkv", 2),
    "attn.to_out.0": ("x_block.attn.proj", None),
    "attn.to_add_out": ("context_block.attn.proj", None),
    "attn2.to_out.0": ("x_block.attn2.proj", None),
    "ff.net.0.proj": ("x_block.mlp.fc1", None),
    "ff.net.2": ("x_block.mlp.fc2", None),
    "ff_context.net.0.proj": ("context_block.mlp.fc1", None),
    "ff_context.net.2": ("context_block.mlp.fc2", None),
    "norm1.linear": ("x_block.adaLN_modulation.1", None),
    "norm1_context.linear": ("context_block.adaLN_modulation.1", None),
}


def comfy_target(module: str) -> tuple[str, int | None]:
    """`transformer_blocks.3.attn.to_q` -> (`joint_blocks.3.x_block.attn.qkv`, 0)."""
    head, index, rest = module.split(".", 2)
    assert head == "transformer_blocks", module
    target, part = COMFY_SD3_BLOCK[rest]
    return f"joint_blocks.{index}.{target}", part


def test_file_keys_are_the_layout_comfyui_maps_for_sd3(trained: Path, sd3_dir: Path) -> None:
    """Every module of the file is a `transformer.` key ComfyUI's SD3 map holds, each
    fused qkv target gets its three slices, each as wide as the hidden size (ComfyUI
    slices qkv by depth * 64 rows = the hidden size of every SD3 release), and no two
    modules land on one target."""
    weights = load_file(trained / "s.safetensors")
    modules = sorted({k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in weights})
    assert all(f"transformer.{m}.lora_A.weight" in weights for m in modules)
    targets = [comfy_target(m) for m in modules]
    assert len(set(targets)) == len(targets)
    model = loaded_model(sd3_dir)
    hidden = model.model.config.num_attention_heads * model.model.config.attention_head_dim
    for module, (target, part) in zip(modules, targets, strict=True):
        if part is not None:
            assert model.model.get_submodule(module).out_features == hidden
            assert all((target, p) in targets for p in range(3)), target
    # The dual-attention block (3.5 Medium) and the context-pre-only last block.
    assert ("joint_blocks.0.x_block.attn2.qkv", 0) in targets
    assert not any(t.startswith("joint_blocks.1.context_block.mlp") for t, _ in targets)


# ---- memory -------------------------------------------------------------------------------------
def test_gradient_checkpointing_gives_the_same_lora_gradients(sd3_dir: Path) -> None:
    from aitk.data.batch import DataBatch

    model = loaded_model(sd3_dir)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    params = list(network.trainable_parameters())
    randomise(network, scale=0.05)
    batch = DataBatch(captions=["a", "b"],
                      latents=model.encode_images(torch.rand(2, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))
    plain, checkpointed = step_grads_without_and_with_checkpointing(model, params, batch)
    assert any(g.abs().max() > 0 for g in plain)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8"])
def test_quantized_transformer_trains_only_the_lora(sd3_dir: Path, qtype: str) -> None:
    from aitk.data.batch import DataBatch
    from aitk.models.quantize import is_quantized

    model = loaded_model(sd3_dir, quantize=True, qtype=qtype, quantize_te=True)
    tr = model.model
    assert is_quantized(tr.transformer_blocks[0].attn.to_q)
    assert is_quantized(model.text_encoder_3)
    for kept in (tr.proj_out, tr.context_embedder, tr.norm_out.linear,
                 tr.time_text_embed.timestep_embedder.linear_1):
        assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg())
    batch = DataBatch(captions=["a"],
                      latents=model.encode_images(torch.rand(1, 3, 32, 32) * 2 - 1),
                      prompt_embeds=model.get_prompt_embeds(["a red circle"]))
    assert_a_step_reaches_only_the_lora(model, network, batch)


# ---- loading errors -----------------------------------------------------------------------------
def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, sd3_dir: Path, hub_offline,
                                           capsys) -> None:
    repo = "stabilityai/stable-diffusion-3.5-large"
    path = sd3_job(tmp_path, sd3_dir, model={"arch": "sd3", "name_or_path": repo})
    assert cli_main([str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and repo in err[0] and "Traceback" not in err[0]
    assert "hub id" in err[0]
