"""The `wan22_5b` arch (Wan 2.2 TI2V 5B) on a tiny random model built locally: the 2.2
VAE's 16x latents, training on video batches, previews as frames (text to video, and
image to video from `ctrl_img` the TI2V way), Ctrl+C and exact resume, gradient
checkpointing, a quantized step, an offline hub id, and interop: diffusers'
`load_lora_weights` on the same tiny pipeline gives the trainer's own frames, and the
file's keys are the ones ComfyUI's Wan loader maps."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.models.base import GenerateImageConfig
from aitk.models.registry import load_model
from aitk.models.wan21.model import run_pipeline
from aitk.models.wan22_5b.model import Wan22_5BModel
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    assert_lora_file,
    clip_batch,
    loaded_for_training,
    model_cfg,
    run_to_the_end,
    tiny_model_folder,
    train_cfg,
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

ARCH = "wan22_5b"
FRAMES = 5  # 4k + 1 pixel frames -> 2 latent frames
SIDE = 64  # two multiples of 32: latents 4 x 4, 2 x 2 tokens per frame
wan5b_cfg = partial(model_cfg, ARCH)
wan5b_dir = tiny_model_folder(Wan22_5BModel)

# ComfyUI's Wan model (comfy/ldm/wan/model.py, WanAttentionBlock: WanSelfAttention q/k/v/o,
# WanT2VCrossAttention q/k/v/o, WanFeedForward [Linear, GELU, Linear]) is what loads a
# Wan 2.2 5B checkpoint; comfy/lora.py model_lora_keys_unet maps `diffusion_model.<its
# module>` to `<its module>.weight` for every model, and comfy/weight_adapter/lora.py
# reads `<key>.lora_B.weight` / `.lora_A.weight` / `.alpha`. The adapted Linear layers of
# block i, as ComfyUI names them:
COMFY_WAN_BLOCK_LINEARS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
                           "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o",
                           "ffn.0", "ffn.2")
COMFY_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".alpha")


@pytest.fixture
def model(wan5b_dir: Path) -> Wan22_5BModel:
    return loaded_for_training(ARCH, wan5b_dir, train_cfg(timestep_type="shift"))


def video_batch(model: Wan22_5BModel, seed: int = 0) -> DataBatch:
    return clip_batch(model, FRAMES, SIDE, seed)


def job(tmp: Path, model_dir: Path, name: str = "w", **overrides: Any) -> Path:
    # The example images at 64 px: 2 x 2 tokens (32 px would leave one).
    return write_video_job(tmp, name, ARCH, model_dir, SIDE, **overrides)


# ---- load, encode, schedule -----------------------------------------------------------
def test_loads_the_16x_vae_and_reads_the_5b_shift(model: Wan22_5BModel) -> None:
    assert model.is_video and model.get_bucket_divisibility() == 32
    assert model.vae.config.is_residual and model.vae_scale_factor == 16
    video = model.encode_images(torch.rand(1, 3, FRAMES, SIDE, SIDE) * 2 - 1)
    assert video.shape == (1, 4, 2, 4, 4)  # z_dim 4 at 1/16 size, (F - 1) / 4 + 1 frames
    assert model.encode_images(torch.rand(2, 3, SIDE, SIDE)).shape == (2, 4, 1, 4, 4)
    assert model.decode_latents(video).shape == (1, 3, FRAMES, SIDE, SIDE)
    raw = model.vae.encode(torch.zeros(1, 3, 1, SIDE, SIDE)).latent_dist.mean
    mean = torch.tensor(model.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(model.vae.config.latents_std).view(1, -1, 1, 1, 1)
    assert torch.allclose(model.encode_images(torch.zeros(1, 3, SIDE, SIDE)),
                          (raw - mean) / std, atol=1e-5)
    assert model.flow_shift().shift == 5.0  # the scheduler config's flow_shift
    # A different VAE from 2.1's: its latents never share a cache with Wan 2.1's.
    assert model.latent_space_version != "wan-1"


def test_a_step_on_video_trains_the_lora(model: Wan22_5BModel) -> None:
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    assert network.target_modules and all(m.startswith("blocks.")
                                           for m in network.target_modules)
    assert_a_step_reaches_only_the_lora(model, network, video_batch(model))


# ---- previews -------------------------------------------------------------------------
def test_previews_are_frames_and_ctrl_img_starts_the_clip(model: Wan22_5BModel,
                                                          tmp_path: Path) -> None:
    red, green = tmp_path / "red.png", tmp_path / "green.png"
    Image.new("RGB", (80, 60), (220, 30, 30)).save(red)
    Image.new("RGB", (80, 60), (30, 220, 30)).save(green)

    def frames(**cfg: Any) -> np.ndarray:
        gen = GenerateImageConfig(prompt="a cat", width=SIDE, height=SIDE, sample_steps=2,
                                  num_frames=FRAMES, guidance_scale=2.0, seed=3, **cfg)
        out = model.generate_images([gen])[0]
        assert isinstance(out, list) and len(out) == FRAMES
        assert all(f.size == (SIDE, SIDE) for f in out)
        return np.stack([np.asarray(f, dtype=np.float32) / 255 for f in out])

    t2v, from_red, from_green = frames(), frames(ctrl_img=str(red)), frames(ctrl_img=str(green))
    assert np.abs(from_red - t2v).max() > 4 / 255
    assert np.abs(from_red - from_green).max() > 4 / 255  # the picture conditions the clip
    image = model.generate_images([GenerateImageConfig(
        prompt="a cat", width=SIDE, height=SIDE, sample_steps=2, num_frames=1)])[0]
    assert isinstance(image, Image.Image) and image.size == (SIDE, SIDE)


def test_ti2v_preview_holds_the_pictures_latents_as_the_first_frame(
        model: Wan22_5BModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WanImageToVideoPipeline with expand_timesteps: every transformer call sees the
    picture's normalised VAE latents as latent frame 0, with timestep 0 on its tokens."""
    picture = tmp_path / "p.png"
    Image.new("RGB", (SIDE, SIDE), (200, 120, 40)).save(picture)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append((kw["hidden_states"].clone(), kw["timestep"].clone())),
        with_kwargs=True)
    try:
        model.generate_images([GenerateImageConfig(
            prompt="x", width=SIDE, height=SIDE, sample_steps=2, num_frames=FRAMES,
            guidance_scale=1.0, ctrl_img=str(picture))])
    finally:
        hook.remove()
    pixels = torch.tensor(np.asarray(Image.open(picture).convert("RGB")), dtype=torch.float32)
    first = model.encode_images(pixels.permute(2, 0, 1)[None] / 127.5 - 1)
    assert len(seen) == 2
    tokens_per_frame = (SIDE // 32) ** 2
    for hidden, t in seen:
        assert torch.allclose(hidden[:, :, :1], first, atol=1e-4)
        assert t.shape == (1, 2 * tokens_per_frame)  # one timestep per token
        assert (t[0, :tokens_per_frame] == 0).all() and (t[0, tokens_per_frame:] > 0).all()


# ---- the job: files, Ctrl+C and exact resume ------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, wan5b_dir: Path) -> Path:
    return run_to_the_end(job(tmp_path_factory.mktemp("wan22_5b-run"), wan5b_dir))


def test_job_writes_the_layout_comfyui_maps(trained: Path) -> None:
    final = trained / "w.safetensors"
    assert_lora_file(final, "diffusion_model.blocks.", ARCH)
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()
    keys = set(load_file(final))
    pattern = re.compile(r"diffusion_model\.blocks\.(\d+)\.(.+?)(\.lora_[AB]\.weight|\.alpha)$")
    modules = set()
    for key in keys:
        match = pattern.fullmatch(key)
        assert match, key
        modules.add((int(match[1]), match[2]))
    # Every Linear of the one tiny block, named as ComfyUI's Wan model names it, with
    # both factors and the alpha its loader scales by.
    assert modules == {(0, name) for name in COMFY_WAN_BLOCK_LINEARS}
    assert keys == {f"diffusion_model.blocks.0.{name}{s}" for name in COMFY_WAN_BLOCK_LINEARS
                    for s in COMFY_SUFFIXES}
    assert all(float(load_file(final)[k]) == ALPHA for k in keys if k.endswith(".alpha"))


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(trained: Path, tmp_path: Path,
                                                            wan5b_dir: Path,
                                                            monkeypatch) -> None:
    assert_ctrl_c_then_resume_matches(job(tmp_path, wan5b_dir), trained, monkeypatch)


# ---- interop: diffusers' own pipeline + load_lora_weights -----------------------------
@pytest.mark.parametrize("first_frame", [False, True], ids=["t2v", "i2v"])
def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(
        first_frame: bool, wan5b_dir: Path, tmp_path: Path) -> None:
    from diffusers import WanImageToVideoPipeline, WanPipeline

    lora = random_lora_file(load_model(wan5b_cfg(wan5b_dir)), tmp_path / "l.safetensors")
    picture = tmp_path / "first.png"
    Image.new("RGB", (SIDE, SIDE), (30, 200, 60)).save(picture)
    gen = GenerateImageConfig(prompt="a red circle", width=SIDE, height=SIDE, sample_steps=3,
                              seed=5, guidance_scale=2.0, num_frames=FRAMES,
                              ctrl_img=str(picture) if first_frame else None)
    ours, embeds = trainer_preview(load_model(wan5b_cfg(wan5b_dir)), lora, gen,
                                   as_array=frames_array)

    # diffusers reads the folder's own model_index (expand_timesteps) for text to video;
    # the TI2V image-to-video pipeline is the same parts with expand_timesteps.
    if first_frame:
        pipe = WanImageToVideoPipeline.from_pretrained(
            wan5b_dir, text_encoder=None, tokenizer=None, image_encoder=None,
            image_processor=None, expand_timesteps=True, dtype=torch.float32)
        inputs = {"image": Image.open(picture).convert("RGB")}
    else:
        pipe = WanPipeline.from_pretrained(wan5b_dir, text_encoder=None, tokenizer=None,
                                           dtype=torch.float32)
        assert pipe.config.expand_timesteps
        inputs = {}
    pipe.set_progress_bar_config(disable=True)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""],
                                  as_array=frames_array, **inputs)
    # Same float32 CPU math on both sides; the LoRA really changes the clip.
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs, changed_by=8 / 255)


# ---- gradient checkpointing, quantization, offline ------------------------------------
def test_gradient_checkpointing_gives_the_same_lora_gradients(model: Wan22_5BModel) -> None:
    assert_checkpointing_keeps_the_lora_gradients(model, video_batch, reached=any)
    assert model.model.gradient_checkpointing


def test_quantized_transformer_trains_only_the_lora(wan5b_dir: Path) -> None:
    from aitk.models.quantize import is_quantized

    model = loaded_for_training(ARCH, wan5b_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model) and not is_quantized(model.model.proj_out)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, video_batch(model))


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, wan5b_dir: Path, hub_offline,
                                           capsys) -> None:
    hub_id = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    path = job(tmp_path, wan5b_dir, model={"arch": ARCH, "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys, says=("hub id",),
                                      traceback_anywhere=True)
