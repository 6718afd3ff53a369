"""The Wan archs (`wan21`, `wan21_i2v`, `wan22_14b`, `wan22_14b_i2v`) on tiny random
models built locally: load, train with LoRA on 5-D (video) batches, previews as frames,
Ctrl+C and exact resume, interop with diffusers' WanPipeline / WanImageToVideoPipeline
(`load_lora_weights` on the saved files gives the trainer's own frames), and Wan 2.2's
experts: which one runs for a timestep, `train_high_noise: false`, and
`switch_boundary_every` turns."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.data.batch import DataBatch
from aitk.models.base import GenerateImageConfig
from aitk.models.registry import get_model_class
from aitk.models.wan21.model import run_pipeline
from aitk.models.wan22.model import HIGH, LOW, expert_for_micro_step
from aitk.run import train as train_module
from aitk.run.optim import Schedule
from aitk.run.train import LoopSettings, Run, compute_loss, step_generator
from tests.aitk.models.arch_checks import (
    STEPS,
    assert_a_step_reaches_only_the_lora,
    assert_same_weights,
    interrupt_via_sigint_then_resume,
    last_step_sample,
    model_cfg,
    randomise,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

ARCHS = ("wan21", "wan21_i2v", "wan22_14b", "wan22_14b_i2v")
FRAMES = 5  # 4k + 1 pixel frames -> 2 latent frames


@pytest.fixture(scope="module")
def wan_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wan-models")
    out = {}
    for arch in ARCHS:
        get_model_class(arch).build_tiny(root / arch)
        out[arch] = root / arch
    return out


def loaded(arch: str, folder: Path, **cfg) -> object:
    model = get_model_class(arch)(model_cfg(arch, folder, **cfg))
    model.load_model()
    return model


def video_batch(model, seed: int = 0, frames: int = FRAMES) -> DataBatch:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.rand(2, 3, frames, 32, 32, generator=gen) * 2 - 1
    return DataBatch(captions=["a", "b"], tensor=pixels, latents=model.encode_images(pixels),
                     prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))


def wan_job(tmp: Path, arch: str, model_dir: Path, name: str = "w", **overrides: Any) -> Path:
    settings = dict(
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3, "timestep_type": "shift"},
        save={"dtype": "float32", "save_every": 1, "max_step_saves_to_keep": 1},
        sample=last_step_sample(guidance_scale=1.0),
    )
    if arch.startswith("wan22"):
        # Turns of 2 steps: a resume at step 2 must pick the low-noise expert from the
        # step number (a counter restarted at 0 would pick the high-noise one).
        settings["train"] = {**settings["train"], "switch_boundary_every": 2}
    return write_lora_job(tmp, name, arch, model_dir, **{**settings, **overrides})


# ---- load, encode, schedule -----------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_loads_encodes_images_and_videos_and_reads_the_shift(arch: str, wan_dirs):
    model = loaded(arch, wan_dirs[arch])
    assert model.is_video and model.get_bucket_divisibility() == 16
    image = model.encode_images(torch.rand(2, 3, 32, 32) * 2 - 1)
    assert image.shape == (2, 4, 1, 4, 4)  # an image is a 1-frame video
    video = model.encode_images(torch.rand(1, 3, FRAMES, 32, 32) * 2 - 1)
    assert video.shape == (1, 4, 2, 4, 4)
    assert model.decode_latents(video).shape == (1, 3, FRAMES, 32, 32)
    # Latents are normalised with the VAE config's per-channel mean and std.
    raw = model.vae.encode(torch.zeros(1, 3, 1, 32, 32)).latent_dist.mean
    mean = torch.tensor(model.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(model.vae.config.latents_std).view(1, -1, 1, 1, 1)
    assert torch.allclose(model.encode_images(torch.zeros(1, 3, 32, 32)),
                          (raw - mean) / std, atol=1e-5)
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    assert model.flow_shift().shift == 3.0  # the scheduler config's flow_shift
    embeds = model.get_prompt_embeds(["a red circle", "hi"])
    assert [t.shape[0] for t in embeds.text_embeds] == [13, 3]  # ByT5: bytes + </s>


# ---- training on video batches --------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_trains_a_lora_on_video_batches_through_the_loop(arch: str, wan_dirs):
    model = loaded(arch, wan_dirs[arch])
    model.configure_training(SimpleNamespace(timestep_type="sigmoid",
                                             switch_boundary_every=1))
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    params = network.trainable_parameters()
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    batch = video_batch(model)
    losses: list[float] = []
    run = Run(model=model, params=params, optimizer=optimizer,
              schedule=Schedule(1e-2, 3, "constant", 0, 0.0),
              settings=LoopSettings(total_steps=3, save_every=100, seed=1),
              next_batch=lambda: batch, save=lambda step: None, sample=lambda step: None,
              log=lambda step, loss, lr: losses.append(loss))
    assert train_module.train(run, 0) is train_module.Outcome.FINISHED
    assert len(losses) == 3 and all(np.isfinite(losses))
    moved = [not torch.equal(a, b) for a, b in zip(before, params, strict=True)]
    assert any(moved)


@pytest.mark.parametrize("arch", ARCHS)
def test_previews_are_frames_and_one_frame_is_an_image(arch: str, wan_dirs, tmp_path):
    model = loaded(arch, wan_dirs[arch])
    ctrl = tmp_path / "first.png"
    Image.new("RGB", (48, 40), (220, 30, 30)).save(ctrl)
    video, image = model.generate_images([
        GenerateImageConfig(prompt="a cat", width=32, height=32, sample_steps=2,
                            num_frames=FRAMES, guidance_scale=2.0, ctrl_img=str(ctrl)),
        GenerateImageConfig(prompt="a cat", width=32, height=32, sample_steps=2,
                            num_frames=1, guidance_scale=1.0, ctrl_img=str(ctrl))])
    assert isinstance(video, list) and len(video) == FRAMES
    assert all(f.size == (32, 32) for f in video)
    assert isinstance(image, Image.Image) and image.size == (32, 32)


# ---- the job: files, Ctrl+C and exact resume ------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, wan_dirs) -> dict[str, Path]:
    out = {}
    for arch in ARCHS:
        tmp = tmp_path_factory.mktemp(f"{arch}-run")
        assert cli_main([str(wan_job(tmp, arch, wan_dirs[arch]))]) == 0
        out[arch] = tmp / "out" / "w"
    return out


def test_wan21_job_writes_the_original_wan_layout(trained):
    folder = trained["wan21"]
    weights = load_file(folder / "w.safetensors")
    assert weights and all(k.startswith("diffusion_model.blocks.") for k in weights)
    assert "diffusion_model.blocks.0.self_attn.q.lora_A.weight" in weights
    assert "diffusion_model.blocks.0.ffn.0.lora_B.weight" in weights
    alphas = [v for k, v in weights.items() if k.endswith(".alpha")]
    assert alphas and all(float(v) == 8.0 for v in alphas)
    assert any(v.abs().max() > 0 for k, v in weights.items() if "lora_B" in k)
    with safe_open(str(folder / "w.safetensors"), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == "wan21"
    assert (folder / "samples" / f"{STEPS:09d}_0.png").exists()


def test_wan22_job_writes_one_file_per_expert_and_prunes_by_step(trained):
    folder = trained["wan22_14b"]
    names = sorted(p.name for p in folder.glob("*.safetensors"))
    # max_step_saves_to_keep 1: steps 1 and 2 went, both files of each.
    assert names == ["w_000000003_high_noise.safetensors", "w_000000003_low_noise.safetensors",
                     "w_high_noise.safetensors", "w_low_noise.safetensors"]
    for part in names:
        weights = load_file(folder / part)
        assert weights and all(k.startswith("diffusion_model.blocks.") for k in weights)
        assert any(v.abs().max() > 0 for k, v in weights.items() if "lora_B" in k)


@pytest.mark.parametrize("arch", ARCHS)
def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(arch: str, tmp_path: Path,
                                                            wan_dirs, trained, monkeypatch):
    interrupt_via_sigint_then_resume([str(wan_job(tmp_path, arch, wan_dirs[arch]))],
                                     monkeypatch)
    files = sorted(p.name for p in trained[arch].glob("*.safetensors"))
    for name in files:
        assert_same_weights(tmp_path / "out" / "w" / name, trained[arch] / name)


# ---- interop: diffusers' own pipeline + load_lora_weights -----------------------------
def frames_array(frames) -> np.ndarray:
    return np.stack([np.asarray(f, dtype=np.float32) / 255.0 for f in frames])


def random_lora(model, path: Path) -> AdapterNetwork:
    """A LoRA with clearly visible weights (alpha 8 != rank 4), saved by the trainer."""
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    randomise(network, seed=4, scale=0.3)
    network.save_file(path)
    return network


@pytest.mark.parametrize("arch", ARCHS)
def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(arch: str, wan_dirs,
                                                                     tmp_path: Path):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    folder = wan_dirs[arch]
    model = loaded(arch, folder)
    lora = tmp_path / "l.safetensors"
    saved = random_lora(model, lora)
    ctrl = tmp_path / "first.png"
    Image.new("RGB", (32, 32), (30, 200, 60)).save(ctrl)
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=32, sample_steps=3,
                              seed=5, guidance_scale=2.0, num_frames=FRAMES,
                              ctrl_img=str(ctrl))
    # The trainer's preview from a fresh model that loaded the file back.
    fresh = loaded(arch, folder)
    network = AdapterNetwork.attach(fresh, NetCfg(linear=4, linear_alpha=8.0))
    network.load_file(lora)
    for a, b in zip(saved.trainable_parameters(), network.trainable_parameters(),
                    strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    embeds = fresh.encode_prompts([gen.prompt, ""])
    ours = frames_array(fresh.generate_images([gen], embeds)[0])

    i2v = arch.endswith("i2v")
    cls = WanImageToVideoPipeline if i2v else WanPipeline
    pipe = cls.from_pretrained(folder, text_encoder=None, tokenizer=None, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    inputs = {"image": Image.open(ctrl).convert("RGB")} if i2v else {}

    def theirs() -> np.ndarray:
        return frames_array(run_pipeline(pipe, gen, embeds[gen.prompt], embeds[""],
                                         torch.Generator().manual_seed(gen.seed),
                                         torch.device("cpu"), torch.float32, **inputs))

    base = theirs()
    files = sorted(tmp_path.glob("l*.safetensors"))
    if arch.startswith("wan22"):  # one file per expert, as ComfyUI's two loaders take them
        assert [p.name for p in files] == ["l_high_noise.safetensors",
                                           "l_low_noise.safetensors"]
        pipe.load_lora_weights(str(files[0]))
        pipe.load_lora_weights(str(files[1]), load_into_transformer_2=True)
        assert any("lora_B" in n for n, _ in pipe.transformer_2.named_parameters())
    else:
        assert files == [lora]
        pipe.load_lora_weights(str(lora))
    assert any("lora_B" in n for n, _ in pipe.transformer.named_parameters())
    with_lora = theirs()
    # Same float32 CPU math on both sides; 8-bit frame rounding is the only slack.
    assert np.abs(with_lora - ours).max() <= 2 / 255
    assert np.abs(with_lora - base).max() > 8 / 255  # the LoRA really changed the video


def test_older_diffusers_named_files_still_load(wan_dirs, tmp_path: Path):
    from safetensors.torch import save_file

    model = loaded("wan21", wan_dirs["wan21"])
    network = random_lora(model, tmp_path / "new.safetensors")
    internal = network.state_dict()
    # aitk's older layout: `diffusion_model.` + diffusers module names (and alphas).
    old = {f"diffusion_model.{k}": v for k, v in internal.items()}
    old.update({f"diffusion_model.{k.rsplit('.lora_', 1)[0]}.alpha": torch.tensor(8.0)
                for k in internal})
    save_file(old, str(tmp_path / "old.safetensors"))
    other = AdapterNetwork.attach(loaded("wan21", wan_dirs["wan21"]),
                                  NetCfg(linear=4, linear_alpha=8.0))
    other.load_file(tmp_path / "old.safetensors")
    assert all(torch.equal(internal[k], v) for k, v in other.state_dict().items())


def test_i2v_condition_matches_the_pipelines_and_uses_the_batch_first_frame(wan_dirs):
    from diffusers import WanImageToVideoPipeline

    model = loaded("wan21_i2v", wan_dirs["wan21_i2v"])
    batch = video_batch(model)
    first = batch.tensor[:, :, 0]
    cond = model.condition_latents(first, 2, 4, 4)
    pipe = WanImageToVideoPipeline.from_pretrained(wan_dirs["wan21_i2v"], text_encoder=None,
                                                   tokenizer=None, dtype=torch.float32)
    _, theirs = pipe.prepare_latents(first[:1].float(), 1, 4, 32, 32, FRAMES, torch.float32,
                                     torch.device("cpu"), torch.Generator().manual_seed(0))
    assert theirs.shape == (1, 8, 2, 4, 4)  # 4 mask channels + z_dim
    assert torch.allclose(cond[:1], theirs, atol=1e-5)
    # The transformer input: noisy latents then the batch's own first-frame condition.
    noisy = torch.randn_like(batch.latents)
    x = model.condition_noisy_latents(noisy, batch)
    assert x.shape[1] == model.model.config.in_channels == 12
    assert torch.equal(x[:, :4], noisy) and torch.allclose(x[:, 4:], cond, atol=1e-6)
    # With cached latents (no pixels) the first latent frame, decoded, stands in.
    cached = DataBatch(captions=batch.captions, latents=batch.latents,
                       prompt_embeds=batch.prompt_embeds)
    assert model.condition_noisy_latents(noisy, cached).shape == x.shape
    assert model.image_embeds_for(batch).shape == (2, 5, 32)  # CLIP: 4 patches + class


# ---- Wan 2.2: the two experts ---------------------------------------------------------
class ExpertSpy:
    """Records which expert ran, with how many items, and the timesteps it got."""

    def __init__(self, model) -> None:
        self.calls: list[tuple[str, int, list[float]]] = []
        self.handles = [model.model.expert(name).register_forward_pre_hook(
            self._hook(name), with_kwargs=True) for name in (HIGH, LOW)]

    def _hook(self, name: str):
        def record(_module, _args, kwargs):
            t = kwargs["timestep"]
            self.calls.append((name, kwargs["hidden_states"].shape[0], t.float().tolist()))
        return record

    def experts(self) -> list[str]:
        return [c[0] for c in self.calls]


def test_wan22_runs_the_expert_that_owns_each_timestep(wan_dirs):
    model = loaded("wan22_14b", wan_dirs["wan22_14b"])
    spy = ExpertSpy(model)
    batch = video_batch(model)
    embeds = batch.prompt_embeds
    with torch.no_grad():
        for t, expert in ((950.0, HIGH), (875.0, HIGH), (874.0, LOW), (100.0, LOW)):
            spy.calls.clear()
            model.get_noise_prediction(batch.latents, torch.tensor([t, t]), embeds)
            assert spy.experts() == [expert], t
        # A batch that straddles the boundary: each item through its own expert.
        spy.calls.clear()
        mixed = model.get_noise_prediction(batch.latents, torch.tensor([950.0, 100.0]),
                                           embeds)
        assert sorted(spy.experts()) == [HIGH, LOW] and all(c[1] == 1 for c in spy.calls)
        alone = [model.get_noise_prediction(batch.latents[i:i + 1], torch.tensor([t]),
                                            embeds.select([i]))
                 for i, t in enumerate((950.0, 100.0))]
    assert torch.allclose(mixed, torch.cat(alone), atol=1e-5)
    # The i2v model switches at 0.9.
    i2v = loaded("wan22_14b_i2v", wan_dirs["wan22_14b_i2v"])
    spy = ExpertSpy(i2v)
    b = video_batch(i2v)
    with torch.no_grad():
        for t, expert in ((900.0, HIGH), (880.0, LOW)):
            spy.calls.clear()
            i2v.get_noise_prediction(i2v.condition_noisy_latents(b.latents, b),
                                     torch.tensor([t, t]), b.prompt_embeds, batch=b)
            assert spy.experts() == [expert], t


def test_wan22_previews_use_both_experts_at_the_boundary(wan_dirs):
    model = loaded("wan22_14b", wan_dirs["wan22_14b"])
    spy = ExpertSpy(model)
    model.generate_images([GenerateImageConfig(prompt="x", width=32, height=32,
                                               sample_steps=6, guidance_scale=1.0)])
    for name, _, ts in spy.calls:
        assert (ts[0] >= 875.0) == (name == HIGH)
    assert set(spy.experts()) == {HIGH, LOW}


def test_switch_boundary_every_takes_turns_with_timesteps_in_range(wan_dirs):
    assert [expert_for_micro_step(i, 2, (HIGH, LOW)) for i in range(6)] == \
        [HIGH, HIGH, LOW, LOW, HIGH, HIGH]
    assert [expert_for_micro_step(i, 1, (LOW,)) for i in range(3)] == [LOW] * 3
    model = loaded("wan22_14b", wan_dirs["wan22_14b"])
    model.configure_training(SimpleNamespace(timestep_type="sigmoid",
                                             switch_boundary_every=2))
    network = AdapterNetwork.attach(model, NetCfg())
    spy = ExpertSpy(model)
    batch = video_batch(model)
    params = network.trainable_parameters()
    run = Run(model=model, params=params, optimizer=torch.optim.AdamW(params, lr=1e-3),
              schedule=Schedule(1e-3, 3, "constant", 0, 0.0),
              # 3 steps x 2 micro-batches: turns of 2 micro-batches each
              settings=LoopSettings(total_steps=3, accumulation=2, save_every=100, seed=1),
              next_batch=lambda: batch, save=lambda s: None, sample=lambda s: None,
              log=lambda *a: None)
    train_module.train(run, 0)
    assert spy.experts() == [HIGH, HIGH, LOW, LOW, HIGH, HIGH]
    for name, _, ts in spy.calls:
        assert all((t >= 875.0) == (name == HIGH) for t in ts)


def test_train_high_noise_false_trains_and_saves_only_the_low_expert(wan_dirs,
                                                                      tmp_path: Path):
    model = loaded("wan22_14b", wan_dirs["wan22_14b"],
                   model_kwargs={"train_high_noise": False})
    model.configure_training(SimpleNamespace(timestep_type="sigmoid",
                                             switch_boundary_every=1))
    network = AdapterNetwork.attach(model, NetCfg())
    assert network.target_modules and all(m.startswith("transformer_2.blocks.")
                                          for m in network.target_modules)
    batch = video_batch(model)
    for micro in range(3):
        model.begin_micro_step(micro)
        gen = step_generator(0, micro, 0)
        assert (model.training_schedule.sample_timesteps(batch.latents, gen) < 875).all()
        compute_loss(model, batch, step_generator(0, micro, 0)).backward()
    with_grad = {n.split(".")[0] for n, p in model.model.named_parameters()
                 if p.grad is not None}
    assert with_grad == {LOW}
    network.save_file(tmp_path / "only.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["only_low_noise.safetensors"]
    # Both switched off: one line at load, no traceback.
    with pytest.raises(Exception, match="train at least one expert"):
        loaded("wan22_14b", wan_dirs["wan22_14b"],
               model_kwargs={"train_high_noise": False, "train_low_noise": False})


# ---- gradient checkpointing, quantization, offline ------------------------------------
@pytest.mark.parametrize("arch", ["wan21", "wan22_14b"])
def test_gradient_checkpointing_gives_the_same_lora_gradients(arch: str, wan_dirs):
    model = loaded(arch, wan_dirs[arch])
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    params = network.trainable_parameters()
    with torch.no_grad():
        for p in params:  # B starts at zero: give both factors values
            p.normal_(0.0, 0.05)
    batch = video_batch(model)

    def grads() -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        model.begin_micro_step(0)
        compute_loss(model, batch, step_generator(1, 0, 0)).backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    model.model.train()
    plain = grads()
    model.get_model_to_train().enable_gradient_checkpointing()
    assert all(t.gradient_checkpointing for t in model.transformers)
    checkpointed = grads()
    assert any(g.abs().max() > 0 for g in plain)
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_quantized_transformer_trains_only_the_lora(wan_dirs):
    from aitk.models.quantize import is_quantized

    model = loaded("wan21", wan_dirs["wan21"], quantize=True, qtype="qint8")
    assert is_quantized(model.model) and not is_quantized(model.model.proj_out)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, video_batch(model))


@pytest.mark.parametrize("arch,hub_id", [("wan21", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),
                                         ("wan22_14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers")])
def test_hub_id_offline_is_one_line_exit_2(arch: str, hub_id: str, tmp_path: Path,
                                           wan_dirs, hub_offline, capsys):
    path = wan_job(tmp_path, arch, wan_dirs[arch],
                   model={"arch": arch, "name_or_path": hub_id})
    assert cli_main([str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and hub_id in err[0] and "Traceback" not in err[0]
    assert "hub id" in err[0]


def test_wan22_low_vram_keeps_the_idle_expert_on_the_cpu(wan_dirs, monkeypatch):
    model = loaded("wan22_14b", wan_dirs["wan22_14b"])
    model.low_vram = True
    model.device = torch.device("cuda", 3)  # only recorded: `.to` is a spy here
    moves: list[tuple[str, str]] = []
    for name in (HIGH, LOW, "vae"):
        module = model.vae if name == "vae" else model.model.expert(name)

        def spy(where, _name=name, _module=module):
            moves.append((_name, str(where)))
            return _module

        monkeypatch.setattr(module, "to", spy)
    assert model._place(LOW) is model.model.transformer_2
    assert moves == [(HIGH, "cpu"), (LOW, "cuda:3")]
    # Previews: each expert visits the device when the pipeline calls it.
    moves.clear()
    x = torch.zeros(1, 4, 1, 4, 4)
    with model.preview_devices(), torch.no_grad():
        for name in (HIGH, LOW):
            model.model.expert(name)(hidden_states=x, timestep=torch.tensor([500.0]),
                                     encoder_hidden_states=torch.zeros(1, 3, 32))
    assert moves == [("vae", "cuda:3"), (LOW, "cpu"), (HIGH, "cuda:3"),
                     (HIGH, "cpu"), (LOW, "cuda:3"), ("vae", "cpu")]


def test_wan22_refuses_to_overwrite_an_expert_file_it_did_not_write(wan_dirs, tmp_path: Path,
                                                                     capsys):
    path = wan_job(tmp_path, "wan22_14b", wan_dirs["wan22_14b"])
    foreign = tmp_path / "out" / "w" / "w_low_noise.safetensors"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"someone else's LoRA")
    assert cli_main([str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and str(foreign) in err[0] and "not written by aitk" in err[0]
    assert foreign.read_bytes() == b"someone else's LoRA"
