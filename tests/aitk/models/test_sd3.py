"""The `sd3` arch (SD 3.5 medium and large) on a tiny random model built locally: load,
the text layout StableDiffusion3Pipeline encodes, train with LoRA, preview, Ctrl+C and
exact resume, checkpointing, quantization, offline hub id, and interop: diffusers'
`load_lora_weights` on the saved file gives the trainer's own preview, and every key
is one ComfyUI's SD3 loader maps (comfy/lora.py + comfy.utils.mmdit_to_diffusers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.adapters.alpha_folding import fold_alphas
from aitk.models.sd3.model import SD3Model
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    assert_reads_back,
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
    trainer_preview,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

sd3_dir = tiny_model_folder(SD3Model, scope="session")


def sd3_job(tmp: Path, model_dir: Path, name: str = "s", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "sd3", model_dir, "shift", 3.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, sd3_dir: Path) -> Path:
    return run_to_the_end(sd3_job(tmp_path_factory.mktemp("sd3-run"), sd3_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> SD3Model:
    model = load_tiny(SD3Model, model_dir, **cfg)
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
    assert_ctrl_c_then_resume_matches(sd3_job(tmp_path, sd3_dir), trained, monkeypatch)


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
    assert_reads_back(network, tmp_path / "l.safetensors", internal, seed=7)
    # A file that carries `.alpha` (other trainers, `diffusion_model.` prefix) reads too.
    save_file(with_alpha_keys(internal, "diffusion_model."), str(tmp_path / "old.safetensors"))
    assert_reads_back(network, tmp_path / "old.safetensors", internal, seed=8)
    lokr = {"m.lokr_w1": torch.ones(2, 2), "m.alpha": torch.tensor(2.0)}
    assert fold_alphas(lokr).keys() == lokr.keys()  # only LoRA modules fold


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(sd3_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path) -> None:
    from diffusers import StableDiffusion3Pipeline

    lora = amplified(trained / "s.safetensors", tmp_path / "strong.safetensors")
    gen = interop_preview(guidance_scale=3.0)
    ours, embeds = trainer_preview(loaded_model(sd3_dir), lora, gen)
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.set_progress_bar_config(disable=True)
    cond, uncond = embeds[gen.prompt], embeds[""]
    theirs = pipeline_render(pipe, gen, prompt_embeds=cond.text_embeds[0][None],
                             pooled_prompt_embeds=cond.pooled_embeds[0],
                             negative_prompt_embeds=uncond.text_embeds[0][None],
                             negative_pooled_prompt_embeds=uncond.pooled_embeds[0])
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


def test_bf16_model_previews_through_the_float32_vae(sd3_dir: Path) -> None:
    """The transformer and text encoders in bf16, the VAE in float32 (as loaded): the
    pipeline's latents are decoded by the model's own float32 decode."""
    assert_bf16_previews_through_the_float32_vae(SD3Model, sd3_dir)


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
    assert_checkpointing_keeps_the_lora_gradients(
        loaded_model(sd3_dir), unseeded_batch, reached=any, init=small_random_factors)


@pytest.mark.parametrize("qtype", ["qfloat8", "qint8"])
def test_quantized_transformer_trains_only_the_lora(sd3_dir: Path, qtype: str) -> None:
    from aitk.models.quantize import is_quantized

    model = loaded_model(sd3_dir, quantize=True, qtype=qtype, quantize_te=True)
    tr = model.model
    assert is_quantized(tr.transformer_blocks[0].attn.to_q)
    assert is_quantized(model.text_encoder_3)
    for kept in (tr.proj_out, tr.context_embedder, tr.norm_out.linear,
                 tr.time_text_embed.timestep_embedder.linear_1):
        assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, unseeded_batch(model, 1))


# ---- loading errors -----------------------------------------------------------------------------
def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, sd3_dir: Path, hub_offline,
                                           capsys) -> None:
    repo = "stabilityai/stable-diffusion-3.5-large"
    path = sd3_job(tmp_path, sd3_dir, model={"arch": "sd3", "name_or_path": repo})
    assert_hub_id_offline_is_one_line(path, repo, capsys, says=("hub id",))
