"""The `flux_kontext` arch on a tiny random Flux model in the Kontext layout (built
locally): the control image as reference tokens (ids axis 0 = 1) appended to the noisy
ones, the prediction sliced back, training on DataBatch objects with control_tensor,
previews with ctrl_img that FluxKontextPipeline + load_lora_weights reproduces, exact
resume, checkpointing."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.errors import ModelError
from aitk.models.base import GenerateImageConfig
from aitk.models.flux_kontext.model import FluxKontextModel
from aitk.run.train import compute_loss
from tests.aitk.models.arch_checks import (
    assert_stop_flag_resume_matches,
    assert_trained_lora,
    last_step_sample,
    loaded_for_training,
    model_cfg,
    ran_in_process,
    randomise,
    tiny_model_folder,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.flux_checks import (
    assert_checkpointing_keeps_the_prediction_grads,
    save_random_lora,
)
from tests.aitk.models.pipeline_checks import (
    assert_lora_turns_the_render_into_the_preview,
    image_levels,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

SIZE = (32, 48)  # H, W of the training pair: latents 4x6, 2x3 packed tokens

kontext_cfg = partial(model_cfg, "flux_kontext")
kontext_dir = tiny_model_folder(FluxKontextModel)


@pytest.fixture
def model(kontext_dir: Path) -> FluxKontextModel:
    return loaded_for_training("flux_kontext", kontext_dir)


def edit_batch(model: FluxKontextModel, seed: int = 0) -> DataBatch:
    """What the edit data layer hands over: targets in [-1, 1], controls in [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.rand(2, 3, *SIZE, generator=gen) * 2 - 1
    control = torch.rand(2, 3, *SIZE, generator=gen)
    captions = ["make it red", "add a cat"]
    return DataBatch(captions=captions, tensor=pixels, latents=model.encode_images(pixels),
                     prompt_embeds=model.get_prompt_embeds(captions), control_tensor=control)


def write_control(path: Path, size: tuple[int, int] = (40, 24), seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


# ---- load, conditioning ----------------------------------------------------------------
def test_builds_and_loads_through_the_registry(model: FluxKontextModel,
                                               kontext_dir: Path) -> None:
    import json

    index = json.loads((kontext_dir / "model_index.json").read_text())
    assert index["_class_name"] == "FluxKontextPipeline"
    assert isinstance(model, FluxKontextModel) and model.arch == "flux_kontext"
    assert model.has_guidance_embedding and model.get_bucket_divisibility() == 16
    assert not any(p.requires_grad for p in model.model.parameters())


def test_control_becomes_reference_tokens_and_the_prediction_is_sliced_back(
        model: FluxKontextModel) -> None:
    """The control is encoded like the target and appended after the noisy tokens with
    ids (1, y, x); the transformer's output is cut back to the noisy tokens."""
    batch = edit_batch(model)
    noisy = torch.randn(2, 4, 4, 6, generator=torch.Generator().manual_seed(1))
    conditioned = model.condition_noisy_latents(noisy, batch)
    assert conditioned.shape == (2, 8, 4, 6)
    assert torch.equal(conditioned[:, :4], noisy)
    assert torch.equal(conditioned[:, 4:], model.encode_images(batch.control_tensor * 2 - 1))
    seen = {}
    model.model.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    model.model.register_forward_hook(lambda m, a, kw, out: seen.update(out=out[0]),
                                      with_kwargs=True)
    with torch.no_grad():
        pred = model.get_noise_prediction(conditioned, torch.tensor([300.0, 700.0]),
                                          batch.prompt_embeds)
        plain = model.get_noise_prediction(noisy, torch.tensor([300.0, 700.0]),
                                           batch.prompt_embeds)
    # the last call was plain Flux (6 tokens); redo the Kontext one for its inputs
    assert seen["hidden_states"].shape[1] == 6
    with torch.no_grad():
        model.get_noise_prediction(conditioned, torch.tensor([300.0, 700.0]),
                                   batch.prompt_embeds)
    ids = seen["img_ids"]
    assert seen["hidden_states"].shape == (2, 12, 16) and ids.shape == (12, 3)
    assert ids[:6, 0].eq(0).all() and ids[6:, 0].eq(1).all()
    assert torch.equal(ids[6:, 1:], ids[:6, 1:])  # same 2-D positions
    assert seen["out"].shape == (2, 12, 16)
    assert pred.shape == noisy.shape
    assert not torch.allclose(pred, plain)  # the reference changes the prediction


def test_a_wrong_size_control_is_resized_to_the_bucket(model: FluxKontextModel) -> None:
    batch = edit_batch(model)
    small = torch.nn.functional.interpolate(batch.control_tensor, size=(16, 24),
                                            mode="bilinear", antialias=True)
    batch.control_tensor = small
    out = model.condition_noisy_latents(torch.zeros(2, 4, 4, 6), batch)
    assert out.shape == (2, 8, 4, 6)
    without = DataBatch(captions=batch.captions, control_tensor=None)
    noisy = torch.zeros(2, 4, 4, 6)
    assert model.condition_noisy_latents(noisy, without) is noisy  # no control: plain Flux


def test_training_steps_with_control_move_the_lora(model: FluxKontextModel) -> None:
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    opt = torch.optim.AdamW(net.trainable_parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    batch = edit_batch(model)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = compute_loss(model, batch, gen)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    ups = [v for k, v in net.state_dict().items() if "lora_B" in k]
    assert any(v.abs().sum() > 0 for v in ups)


def test_gradient_checkpointing_gives_the_same_gradients(model: FluxKontextModel) -> None:
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net)
    batch = edit_batch(model)
    conditioned = model.condition_noisy_latents(
        torch.randn(2, 4, 4, 6, generator=torch.Generator().manual_seed(2)), batch)
    inputs = (conditioned, torch.tensor([250.0, 800.0]), batch.prompt_embeds)
    assert_checkpointing_keeps_the_prediction_grads(model, net, inputs)


# ---- previews and LoRA files ------------------------------------------------------------
def test_saved_lora_loads_in_diffusers_and_gives_the_preview(model: FluxKontextModel,
                                                             kontext_dir: Path,
                                                             tmp_path: Path) -> None:
    """The trainer's preview with a ctrl_img and its LoRA == FluxKontextPipeline after
    load_lora_weights(file) given the same control image, seed and embeds; != the image
    without the LoRA, and != the preview without the control image."""
    from diffusers import FluxKontextPipeline

    path = save_random_lora(model, tmp_path / "lora.safetensors")
    ctrl = write_control(tmp_path / "ctrl.png")  # 40x24: resized to the sample size
    gen_cfg = GenerateImageConfig("make it red", width=32, height=32, seed=5,
                                  guidance_scale=3.5, sample_steps=3, ctrl_img=str(ctrl))
    embeds = model.encode_prompts([gen_cfg.prompt])
    no_ctrl = GenerateImageConfig(**{**vars(gen_cfg), "ctrl_img": None})
    preview, without_ctrl = model.generate_images([gen_cfg, no_ctrl], prompt_embeds=embeds)
    assert preview.size == (32, 32)

    pipe = FluxKontextPipeline.from_pretrained(kontext_dir)
    pipe.set_progress_bar_config(disable=True)
    e = embeds[gen_cfg.prompt]
    image = Image.open(ctrl).convert("RGB").resize((32, 32), Image.Resampling.LANCZOS)

    def render() -> np.ndarray:
        out = pipe(image=image, prompt_embeds=e.text_embeds[0][None],
                   pooled_prompt_embeds=e.pooled_embeds[0], width=32, height=32,
                   num_inference_steps=3, guidance_scale=3.5, max_area=32 * 32,
                   _auto_resize=False, generator=torch.Generator().manual_seed(5))
        return image_levels(out.images[0])

    ours = image_levels(preview)
    assert_lora_turns_the_render_into_the_preview(pipe, path, ours, render, changed_by=10)
    assert np.abs(image_levels(without_ctrl) - ours).max() > 10


def test_bf16_model_previews_with_a_ctrl_img(kontext_dir: Path, tmp_path: Path) -> None:
    """bf16 transformer, float32 VAE: the control is encoded and the result decoded by
    the model's own float32 VAE calls."""
    m = FluxKontextModel(kontext_cfg(kontext_dir), dtype=torch.bfloat16)
    m.load_model()
    cfg = GenerateImageConfig("make it red", width=32, height=48, sample_steps=2,
                              ctrl_img=str(write_control(tmp_path / "c.png")))
    [image] = m.generate_images([cfg])
    assert image.size == (32, 48)


def test_an_unreadable_ctrl_img_is_one_line(model: FluxKontextModel, tmp_path: Path) -> None:
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    cfg = GenerateImageConfig("x", width=32, height=32, sample_steps=1, ctrl_img=str(bad))
    with pytest.raises(ModelError, match="ctrl_img .*bad.png cannot be read"):
        model.generate_images([cfg])


# ---- the job end to end ------------------------------------------------------------------
# The control-image data layer lands on another branch; until then the job's batches get
# their control_tensor here, derived from the batch's own latents (deterministic, so an
# interrupted and resumed run must train exactly like a straight one).
def with_control(compute):
    def compute_loss_with_control(model, batch, generator, *objective):
        if batch.control_tensor is None:
            f = model.vae_scale_factor
            base = batch.latents[:, :3].float().flip(-1)
            batch.control_tensor = torch.sigmoid(base.repeat_interleave(f, -1)
                                                 .repeat_interleave(f, -2))
        return compute(model, batch, generator, *objective)
    return compute_loss_with_control


def kontext_job(root: Path, kontext_dir: Path, name: str) -> Path:
    return write_lora_job(root, name, "flux_kontext", kontext_dir,
                          train={"timestep_type": "flux_shift", "gradient_checkpointing": True,
                                 "lr": 5e-3},
                          sample=last_step_sample(prompts=["[trigger] make it red"]))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, kontext_dir: Path) -> Iterator[Path]:
    from aitk.run import train

    root = tmp_path_factory.mktemp("kontext-job")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "compute_loss", with_control(train.compute_loss))
        out = ran_in_process(kontext_job(root, kontext_dir, "run"))
    yield out


def test_job_trains_saves_and_samples(straight: Path) -> None:
    assert_trained_lora(straight, "run", "transformer.")


def test_ctrl_c_then_resume_matches_the_uninterrupted_run(tmp_path: Path, kontext_dir: Path,
                                                          straight: Path, monkeypatch) -> None:
    """A SIGINT handled mid-step 2 (the in-process StopFlag path) finishes the step, saves
    and exits 130; running again resumes to the same weights. Both runs with the control
    the straight one had."""
    from aitk.run import train

    monkeypatch.setattr(train, "compute_loss", with_control(train.compute_loss))
    assert_stop_flag_resume_matches(kontext_job(tmp_path, kontext_dir, "run"), straight,
                                    monkeypatch)
