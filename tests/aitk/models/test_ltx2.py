"""The `ltx2` arch (LTX-2) on a tiny random model built locally: the 32x / 8x video VAE,
the stacked Gemma prompt states and the 1024-token padding, training on video batches
(the audio stream fed as upstream feeds a clip without sound, the same noise on a
resume), previews as frames, Ctrl+C and exact resume, gradient checkpointing, a
quantized step, an offline hub id, and interop: diffusers' `load_lora_weights` on the
same tiny pipeline gives the trainer's own frames, and the file's keys are the ones
ComfyUI's LTX-2 (LTXAV) loader maps."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.models.base import GenerateImageConfig
from aitk.models.ltx2.model import LTX2Model, padded_prompt, run_pipeline
from aitk.models.ltx2.tiny import TEXT_LEN
from aitk.models.registry import load_model
from aitk.run.train import compute_loss, step_generator
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    clip_batch,
    loaded_for_training,
    model_cfg,
    randomise,
    run_to_the_end,
    tiny_model_folder,
    train_cfg,
    with_alpha_keys,
    write_video_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    arch_pipeline_render,
    frames_array,
    random_lora_file,
    trainer_preview,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

ARCH = "ltx2"
FRAMES = 9  # 8k + 1 pixel frames -> 2 latent frames
SIDE = 64  # two multiples of 32: latents 2 x 2
ltx_cfg = partial(model_cfg, ARCH)
ltx_dir = tiny_model_folder(LTX2Model)

# ComfyUI's LTX-2 model (comfy/ldm/lightricks/av_model.py, BasicAVTransformerBlock: the
# CrossAttention modules attn1, attn2, audio_attn1, audio_attn2, audio_to_video_attn and
# video_to_audio_attn, each to_q/to_k/to_v/to_out.0; FeedForward ff and audio_ff, each
# net.0.proj/net.2) names block i's adapted Linear layers so; comfy/lora.py's LTXV/LTXAV
# branch and its generic mapping take `diffusion_model.<module>`, and
# comfy/weight_adapter/lora.py reads `.lora_B.weight` / `.lora_A.weight` (no `.alpha`:
# scale 1).
COMFY_LTXAV_BLOCK_LINEARS = tuple(
    f"{attn}.{proj}" for attn in ("attn1", "attn2", "audio_attn1", "audio_attn2",
                                  "audio_to_video_attn", "video_to_audio_attn")
    for proj in ("to_q", "to_k", "to_v", "to_out.0")) + tuple(
    f"{ff}.{layer}" for ff in ("ff", "audio_ff") for layer in ("net.0.proj", "net.2"))


@pytest.fixture
def model(ltx_dir: Path) -> LTX2Model:
    return loaded_for_training(ARCH, ltx_dir, train_cfg(timestep_type="shift"))


def video_batch(model: LTX2Model, seed: int = 0) -> DataBatch:
    return clip_batch(model, FRAMES, SIDE, seed)


def job(tmp: Path, model_dir: Path, name: str = "w", **overrides: Any) -> Path:
    # The example images at 64 px: 2 x 2 latent cells (32 px would leave one).
    return write_video_job(tmp, name, ARCH, model_dir, SIDE, **overrides)


# ---- load, encoders, schedule ---------------------------------------------------------
def test_loads_the_32x_8x_vae_and_the_dynamic_shift(model: LTX2Model) -> None:
    assert model.is_video and model.get_bucket_divisibility() == 32
    video = model.encode_images(torch.rand(1, 3, FRAMES, SIDE, SIDE) * 2 - 1)
    assert video.shape == (1, 8, 2, 2, 2)  # (F - 1) / 8 + 1 frames at 1/32 size
    assert model.encode_images(torch.rand(2, 3, SIDE, SIDE)).shape == (2, 8, 1, 2, 2)
    assert model.decode_latents(video).shape == (1, 3, FRAMES, SIDE, SIDE)
    raw = model.vae.encode(torch.zeros(1, 3, 1, SIDE, SIDE)).latent_dist.mode()
    mean = model.vae.latents_mean.view(1, -1, 1, 1, 1)
    std = model.vae.latents_std.view(1, -1, 1, 1, 1)
    assert torch.allclose(model.encode_images(torch.zeros(1, 3, SIDE, SIDE)),
                          (raw - mean) / std, atol=1e-5)
    shift = model.training_schedule.shift
    assert shift.dynamic and (shift.base_shift, shift.max_shift) == (0.95, 2.05)


def test_prompts_are_stacked_gemma_states_left_padded_to_1024(model: LTX2Model) -> None:
    embeds = model.get_prompt_embeds(["a red circle", ""])
    width = model.text_encoder.config.text_config.hidden_size * (
        model.text_encoder.config.text_config.num_hidden_layers + 1)
    # <bos> + one token per character; the empty prompt is <bos> alone.
    assert [tuple(t.shape) for t in embeds.text_embeds] == [(13, width), (1, width)]
    tokens = model.tokenizer(["a red circle"], return_tensors="pt")
    states = model.text_encoder(**tokens, output_hidden_states=True).hidden_states
    assert torch.allclose(embeds.text_embeds[0][:, ::len(states)], states[0][0], atol=1e-6)
    padded, mask = padded_prompt(embeds, torch.device("cpu"), torch.float32)
    assert padded.shape == (2, TEXT_LEN, width) and mask.sum(1).tolist() == [13, 1]
    assert mask[0, -13:].all() and not mask[0, :-13].any()  # left padding
    assert torch.equal(padded[0, -13:], embeds.text_embeds[0]) and not padded[0, :-13].any()


def test_the_audio_stream_of_a_silent_clip_repeats_per_micro_step(model: LTX2Model) -> None:
    frames = model.audio_frames(2)  # 9 frames at 24 fps, 25 audio latents a second
    assert frames == round(9 / 24 * 25)
    model.begin_micro_step(5)
    first = model.silent_audio(2, frames)
    model.begin_micro_step(6)
    other = model.silent_audio(2, frames)
    model.begin_micro_step(5)
    assert torch.equal(model.silent_audio(2, frames), first) and not torch.equal(first, other)
    assert first.shape == (2, frames, model.model.config.audio_in_channels)
    # So one step's loss is a function of (seed, step, micro-step) alone.
    batch = video_batch(model)
    losses = []
    for _ in range(2):
        model.begin_micro_step(3)
        with torch.no_grad():
            losses.append(compute_loss(model, batch, step_generator(1, 3, 0)))
    assert torch.equal(*losses)


def test_a_step_on_video_trains_the_lora(model: LTX2Model) -> None:
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    assert network.target_modules and all(m.startswith("transformer_blocks.")
                                           for m in network.target_modules)
    assert_a_step_reaches_only_the_lora(model, network, video_batch(model))


# ---- previews -------------------------------------------------------------------------
def test_previews_are_frames_and_one_frame_is_an_image(model: LTX2Model) -> None:
    video, image = model.generate_images([
        GenerateImageConfig(prompt="a cat", width=SIDE, height=SIDE, sample_steps=2,
                            num_frames=FRAMES, guidance_scale=2.0, fps=8),
        GenerateImageConfig(prompt="a cat", width=SIDE, height=SIDE, sample_steps=2,
                            num_frames=1, guidance_scale=1.0)])
    assert isinstance(video, list) and len(video) == FRAMES
    assert all(f.size == (SIDE, SIDE) for f in video)
    assert isinstance(image, Image.Image) and image.size == (SIDE, SIDE)
    with pytest.raises(ValueError, match="multiple of 32"):
        model.generate_images([GenerateImageConfig(prompt="x", width=48, height=SIDE)])


def test_ctrl_img_previews_start_the_clip_from_the_picture(model: LTX2Model,
                                                          tmp_path: Path) -> None:
    """LTX2ImageToVideoPipeline: every transformer call sees the picture's normalised
    latents as latent frame 0 (the clip starts from it), and another picture another clip."""
    red, green = tmp_path / "red.png", tmp_path / "green.png"
    Image.new("RGB", (SIDE, SIDE), (220, 30, 30)).save(red)
    Image.new("RGB", (SIDE, SIDE), (30, 220, 30)).save(green)
    seen: list[torch.Tensor] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["hidden_states"].clone()), with_kwargs=True)

    def clip(picture: Path | None) -> np.ndarray:
        gen = GenerateImageConfig(prompt="a cat", width=SIDE, height=SIDE, sample_steps=2,
                                  num_frames=FRAMES, guidance_scale=1.0, fps=8, seed=3,
                                  ctrl_img=str(picture) if picture else None)
        return frames_array(model.generate_images([gen])[0])

    try:
        from_red = clip(red)
    finally:
        hook.remove()
    pixels = torch.tensor(np.asarray(Image.open(red)), dtype=torch.float32)
    first = model.encode_images(pixels.permute(2, 0, 1)[None] / 127.5 - 1)
    tokens = (SIDE // 32) ** 2  # latent frame 0's tokens lead the packed sequence
    packed_first = first[:, :, 0].flatten(2).transpose(1, 2)
    assert len(seen) == 2
    for hidden in seen:
        # The pipeline encodes the picture on its own path (measured: within 1.1e-3 of
        # encode_images); the other tokens are unit noise, far outside this tolerance.
        assert torch.allclose(hidden[:, :tokens], packed_first, atol=5e-3)
        assert (hidden[:, tokens:] - first[:, :, 0].flatten(2).transpose(1, 2)
                ).abs().max() > 0.5
    assert np.abs(from_red - clip(green)).max() > 4 / 255
    assert np.abs(from_red - clip(None)).max() > 4 / 255


# ---- the job: files, Ctrl+C and exact resume ------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, ltx_dir: Path) -> Path:
    return run_to_the_end(job(tmp_path_factory.mktemp("ltx2-run"), ltx_dir))


def test_job_writes_the_layout_comfyui_maps(trained: Path) -> None:
    final = trained / "w.safetensors"
    weights = load_file(final)
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()
    with safe_open(str(final), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == ARCH
    pattern = re.compile(r"diffusion_model\.transformer_blocks\.(\d+)\.(.+)"
                         r"(\.lora_A\.weight|\.lora_B\.weight)")
    modules = set()
    for key in weights:
        match = pattern.fullmatch(key)
        assert match, key  # no `.alpha`: diffusers' LTX-2 loader refuses one
        modules.add((int(match[1]), match[2]))
    assert modules == {(0, name) for name in COMFY_LTXAV_BLOCK_LINEARS}
    ups = [v for k, v in weights.items() if k.endswith("lora_B.weight")]
    assert all(torch.isfinite(v).all() for v in ups) and any(v.abs().max() > 0 for v in ups)


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(trained: Path, tmp_path: Path,
                                                            ltx_dir: Path,
                                                            monkeypatch) -> None:
    assert_ctrl_c_then_resume_matches(job(tmp_path, ltx_dir), trained, monkeypatch)


def test_the_folded_scale_reads_back_and_so_do_files_with_alpha(ltx_dir: Path,
                                                                tmp_path: Path) -> None:
    """alpha / rank is in the up weights of a written file; reading it back restores the
    adapter exactly, and a file that carries alphas (upstream's) is rescaled to them."""
    model = load_model(ltx_cfg(ltx_dir))
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=ALPHA))
    randomise(network, seed=2)
    internal = network.state_dict()
    network.save_file(tmp_path / "l.safetensors")
    written = load_file(tmp_path / "l.safetensors")
    key = "transformer_blocks.0.attn1.to_q.lora_B.weight"
    assert torch.allclose(written[f"diffusion_model.{key}"], internal[key] * ALPHA / 4)
    other = AdapterNetwork.attach(load_model(ltx_cfg(ltx_dir)),
                                  NetCfg(linear=4, linear_alpha=ALPHA))
    other.load_file(tmp_path / "l.safetensors")
    assert all(torch.allclose(v, internal[k], atol=1e-6) for k, v in other.state_dict().items())
    # Upstream-style: the trained B and an alpha per module, `diffusion_model.` names.
    save_file(with_alpha_keys(internal, "diffusion_model."),
              str(tmp_path / "upstream.safetensors"))
    other.load_file(tmp_path / "upstream.safetensors")
    assert all(torch.allclose(v, internal[k], atol=1e-6) for k, v in other.state_dict().items())


# ---- interop: diffusers' own pipeline + load_lora_weights -----------------------------
def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(ltx_dir: Path,
                                                                     tmp_path: Path) -> None:
    from diffusers import LTX2Pipeline

    lora = random_lora_file(load_model(ltx_cfg(ltx_dir)), tmp_path / "l.safetensors")
    gen = GenerateImageConfig(prompt="a red circle", width=SIDE, height=SIDE, sample_steps=3,
                              seed=5, guidance_scale=2.0, num_frames=FRAMES, fps=8)
    ours, embeds = trainer_preview(load_model(ltx_cfg(ltx_dir)), lora, gen,
                                   as_array=frames_array)
    pipe = LTX2Pipeline.from_pretrained(ltx_dir, text_encoder=None, tokenizer=None,
                                        dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""],
                                  as_array=frames_array)
    # Same float32 CPU math on both sides; the LoRA really changes the clip.
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs, changed_by=8 / 255)


# ---- gradient checkpointing, quantization, offline ------------------------------------
def test_gradient_checkpointing_gives_the_same_lora_gradients(model: LTX2Model) -> None:
    assert_checkpointing_keeps_the_lora_gradients(model, video_batch, reached=any)
    assert model.model.gradient_checkpointing


def test_quantized_transformer_trains_only_the_lora(ltx_dir: Path) -> None:
    from aitk.models.quantize import is_quantized

    model = loaded_for_training(ARCH, ltx_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model) and not is_quantized(model.model.proj_out)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, video_batch(model))


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, ltx_dir: Path, hub_offline,
                                           capsys) -> None:
    hub_id = "Lightricks/LTX-2"
    path = job(tmp_path, ltx_dir, model={"arch": ARCH, "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys, says=("hub id",),
                                      traceback_anywhere=True)
