"""LTX-2 with sound (`datasets[].do_audio`, `train.audio_loss_multiplier`) on the tiny
random model: clips with an audio track made here with the provisioned FFmpeg (lavfi's
sine and testsrc), their soundtrack decoded at the audio VAE's rate for the clip's span,
the log-mel the VAE reads, the audio stream's loss (video + multiplier x audio, clips
without sound masked out), the audio-only LoRA modules learning only from sound, the
job end to end (audio latents cached, a silent clip said once, exact resume) and its
preview written as an mp4 with an audio stream."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.data.audio import AudioSpan, clip_span, fit, log_mel
from aitk.data.batch import DataBatch
from aitk.data.dataset import Item, load_audio, scan_folder
from aitk.data.video import ClipSpec
from aitk.models.ltx2.model import LTX2Model
from aitk.models.registry import load_model
from aitk.run.objectives import draw
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import REPO
from tests.aitk.models.arch_checks import (
    STEPS,
    assert_same_weights,
    interrupt_via_sigint_then_resume,
    last_step_sample,
    model_cfg,
    tiny_model_folder,
    train_cfg,
    write_lora_job,
)
from tests.aitk.models.conftest import NetCfg

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

ARCH = "ltx2"
FRAMES = 9
SIDE = 64
RATE = 16000  # the tiny audio VAE's sample rate
ltx_dir = tiny_model_folder(LTX2Model)


def ffmpeg() -> str:
    local = REPO / ".ffmpeg" / "bin" / ("ffmpeg.exe" if os.name == "nt" else "ffmpeg")
    found = str(local) if local.is_file() else shutil.which("ffmpeg")
    if found is None:
        pytest.skip("needs the ffmpeg program (manager install provisions .ffmpeg/)")
    return found


def make_clip(path: Path, seconds: float = 1.0, tone: float | None = 440.0,
              fps: int = 24, caption: str = "a clip", tone_seconds: float | None = None
              ) -> Path:
    """A 64x64 testsrc clip at `fps`, with a stereo 44.1 kHz sine at `tone` Hz (None: no
    audio stream) lasting `tone_seconds` (default: the clip's), AAC in an mp4."""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [ffmpeg(), "-v", "error", "-y", "-f", "lavfi", "-i",
            f"testsrc=size={SIDE}x{SIDE}:rate={fps}:duration={seconds}"]
    if tone is not None:
        args += ["-f", "lavfi", "-i", f"sine=frequency={tone}:sample_rate=44100:"
                 f"duration={tone_seconds or seconds}", "-ac", "2", "-c:a", "aac", "-b:a", "96k"]
    subprocess.run([*args, "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)],
                   check=True, capture_output=True)
    path.with_suffix(".txt").write_text(caption)
    return path


def main_tone(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm[0] * np.hanning(pcm.shape[1])))
    return float(np.fft.rfftfreq(pcm.shape[1], 1 / rate)[spectrum.argmax()])


def scanned(folder: Path, spec: ClipSpec) -> dict[str, Item]:
    return {i.path.name: i for i in scan_folder(folder, resolutions=[SIDE], divisibility=32,
                                                clip=spec, report=lambda m: None)}


# ---- decoding -----------------------------------------------------------------------
def test_the_soundtrack_is_the_clips_span_at_the_vae_rate(tmp_path: Path) -> None:
    make_clip(tmp_path / "ds" / "tone.mp4")
    make_clip(tmp_path / "ds" / "mute.mp4", tone=None)
    items = scanned(tmp_path / "ds", ClipSpec(FRAMES, fps=24, shrink=False, audio=True))
    tone, mute = items["tone.mp4"], items["mute.mp4"]
    assert tone.audio == AudioSpan(0.0, 9 / 24, 9 / 24)
    pcm = load_audio(tone, RATE, 2)
    assert pcm is not None and pcm.dtype == np.float32
    assert pcm.shape == (2, round(9 / 24 * RATE))  # 6000 samples: 9 frames at 24 fps
    assert abs(main_tone(pcm, RATE) - 440) < 30  # the sine itself, resampled
    assert 0.05 < np.abs(pcm).max() <= 1.0
    assert load_audio(tone, RATE, 1).shape == (1, 6000)  # mono on request
    assert load_audio(mute, RATE, 2) is None  # no audio stream: video only
    # Without do_audio no span is kept (and the latent cache keys stay as they were).
    assert scanned(tmp_path / "ds", ClipSpec(FRAMES))["tone.mp4"].audio is None


def test_spread_frames_squeeze_the_whole_soundtrack_into_the_clip(tmp_path: Path) -> None:
    """shrink_video_to_frames: 9 frames spread over 1 s train as 9 frames at 24 fps, so
    the second of sound is squeezed into 0.375 s (upstream's linear stretch): the tone
    rises by 1 / 0.375."""
    make_clip(tmp_path / "ds" / "tone.mp4")
    item = scanned(tmp_path / "ds", ClipSpec(FRAMES, fps=24, audio=True))["tone.mp4"]
    assert item.audio == AudioSpan(0.0, 1.0, 0.375)
    pcm = load_audio(item, RATE, 2)
    assert pcm is not None and pcm.shape == (2, 6000)
    assert abs(main_tone(pcm, RATE) - 440 / 0.375) < 60


def test_audio_preserve_pitch_squeezes_the_soundtrack_at_its_pitch(tmp_path: Path) -> None:
    """The dataset key, through the trainer's scan (aitk.run.assembly), to the decoded
    sound: the same squeeze as above (1 s into 0.375 s), the tone kept at 440 Hz."""
    from types import SimpleNamespace

    from aitk.config.schema import DatasetConfig
    from aitk.run.assembly import scan_datasets

    make_clip(tmp_path / "ds" / "tone.mp4")
    ds = DatasetConfig(folder_path=str(tmp_path / "ds"), num_frames=FRAMES,
                       resolution=[SIDE], do_audio=True, audio_preserve_pitch=True)
    proc = SimpleNamespace(datasets=[ds], model=SimpleNamespace(arch=ARCH),
                           trigger_word=None)
    (item,) = scan_datasets(proc, 32, lambda m: None, is_video=True, audio=True)
    assert item.audio == AudioSpan(0.0, 1.0, 0.375, preserve_pitch=True)
    pcm = load_audio(item, RATE, 2)
    assert pcm is not None and pcm.shape == (2, 6000)
    assert abs(main_tone(pcm, RATE) - 440) < 30


def test_a_soundtrack_shorter_than_the_frames_ends_in_silence(tmp_path: Path) -> None:
    make_clip(tmp_path / "ds" / "short.mp4", tone_seconds=0.2)
    item = scanned(tmp_path / "ds", ClipSpec(FRAMES, fps=24, shrink=False,
                                             audio=True))["short.mp4"]
    pcm = load_audio(item, RATE, 2)
    assert pcm is not None and pcm.shape == (2, 6000)
    assert np.abs(pcm[:, :2400]).max() > 0.05  # the tone's 0.2 s (3200 samples)...
    assert np.abs(pcm[:, 4000:]).max() == 0.0  # ...then silence up to the clip's end


def test_audio_normalize_lifts_the_peak_to_full_scale(tmp_path: Path) -> None:
    make_clip(tmp_path / "ds" / "tone.mp4")  # lavfi's sine: peak 1/8
    spec = ClipSpec(FRAMES, fps=24, shrink=False, audio=True, audio_normalize=True)
    item = scanned(tmp_path / "ds", spec)["tone.mp4"]
    assert item.audio is not None and item.audio.normalize
    loud, quiet = load_audio(item, RATE, 2), load_audio(
        scanned(tmp_path / "ds", ClipSpec(FRAMES, fps=24, shrink=False,
                                          audio=True))["tone.mp4"], RATE, 2)
    assert loud is not None and quiet is not None
    assert 0.98 < np.abs(loud).max() <= 0.999 + 1e-6 and np.abs(quiet).max() < 0.2
    assert np.allclose(loud / np.abs(loud).max(), quiet / np.abs(quiet).max(), atol=0.02)


def test_span_and_fit_rules() -> None:
    assert clip_span((0, 2, 4), 24.0, 12.0, trim=True) == AudioSpan(0.0, 5 / 24, 0.25, False)
    assert clip_span((0, 1), None, 24.0, trim=False) is None  # no rate: no sound
    ramp = np.arange(8, dtype=np.float32)[None]
    assert fit(ramp, 4, stretch=False).tolist() == [[0, 1, 2, 3]]
    assert fit(ramp, 10, stretch=False)[0, 8:].tolist() == [0, 0]  # silence after it
    assert fit(ramp, 4, stretch=True).tolist() == [[0.5, 2.5, 4.5, 6.5]]
    torch_linear = torch.nn.functional.interpolate(torch.from_numpy(ramp)[None], size=13,
                                                   mode="linear", align_corners=False)
    assert np.allclose(fit(ramp, 13, stretch=True), torch_linear[0].numpy(), atol=1e-6)


# ---- the mel and the audio latents -----------------------------------------------------
def test_log_mel_matches_transformers_spectrogram_and_the_vae_takes_it(ltx_dir: Path) -> None:
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    t = np.arange(6000) / RATE
    pcm = np.stack([np.sin(2 * np.pi * 440 * t), 0.5 * np.sin(2 * np.pi * 1000 * t)]
                   ).astype(np.float32)
    mel = log_mel(torch.from_numpy(pcm), RATE, 160, 16)
    assert mel.shape == (2, 6000 // 160 + 1, 16)
    filters = mel_filter_bank(num_frequency_bins=513, num_mel_filters=16, min_frequency=0.0,
                              max_frequency=RATE / 2, sampling_rate=RATE, norm="slaney",
                              mel_scale="slaney")
    theirs = spectrogram(pcm[1].astype(np.float64), window_function(1024, "hann"),
                         frame_length=1024, hop_length=160, power=1.0, center=True,
                         pad_mode="reflect", mel_filters=filters, mel_floor=1e-5,
                         log_mel="log")
    assert np.allclose(mel[1].numpy(), theirs.T, atol=1e-3)
    model = load_model(model_cfg(ARCH, ltx_dir))
    assert model.audio_format() == (RATE, 2)
    latents = model.encode_audio(torch.from_numpy(pcm), FRAMES)
    # 9 frames at 24 fps: 0.375 s x 25 latents a second; C' 2 x 16 / 4 mel bins
    assert latents.shape == (model.audio_frames(2), 8) == (9, 8)
    z = model.audio_vae.encode(mel[None]).latent_dist.mode()  # (1, 2, 10, 4): cut to 9
    packed = z.transpose(1, 2).flatten(2)[0]
    mean, std = model.audio_vae.latents_mean, model.audio_vae.latents_std
    assert torch.allclose(latents, ((packed - mean) / std)[:9], atol=1e-5)


# ---- the step: loss, mask, gradients ---------------------------------------------------
@pytest.fixture
def model(ltx_dir: Path) -> LTX2Model:
    m = load_model(model_cfg(ARCH, ltx_dir))
    m.configure_training(train_cfg(timestep_type="shift", audio_loss_multiplier=0.5))
    return m


def sound_batch(model: LTX2Model, sounds: list[bool]) -> DataBatch:
    gen = torch.Generator().manual_seed(0)
    b = len(sounds)
    pixels = torch.rand(b, 3, FRAMES, SIDE, SIDE, generator=gen) * 2 - 1
    t = np.arange(6000) / RATE
    latents = [model.encode_audio(torch.from_numpy(np.stack(
        [np.sin(2 * np.pi * (300 + 200 * i) * t)] * 2).astype(np.float32)), FRAMES)
        if on else None for i, on in enumerate(sounds)]
    return DataBatch(captions=["a"] * b, latents=model.encode_images(pixels),
                     prompt_embeds=model.get_prompt_embeds(["a red circle"] * b),
                     audio_latents=latents if any(sounds) else None)


def hand_audio_loss(model: LTX2Model, batch: DataBatch, micro: int, step: int
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The audio stream's per-clip mean squared error, computed from its parts: the
    step's timesteps (the objective's draw), the micro-step's audio noise, the clips'
    latents noised at the same sigma, the transformer's audio output."""
    model.begin_micro_step(micro)
    s = draw(model, batch, step_generator(1, step, 0))
    sigma = (s.x.timesteps.float() / 1000).view(-1, 1, 1)
    noise = model.silent_audio(len(batch), model.audio_frames(2))
    seen: dict[str, Any] = {}

    def keep(module, args, kwargs, out):
        seen["in"], seen["out"] = kwargs["audio_hidden_states"], out[1]

    hook = model.model.register_forward_hook(keep, with_kwargs=True)
    try:
        model.get_noise_prediction(s.model_input, s.x.timesteps, s.embeds, batch=batch)
    finally:
        hook.remove()
    model.side_loss()  # taken: the next step starts clean
    per_clip = []
    for i, clean in enumerate(batch.audio_latents or []):
        if clean is None:
            assert torch.equal(seen["in"][i], noise[i])  # pure noise, as without sound
            continue
        assert torch.allclose(seen["in"][i], (1 - sigma[i]) * clean + sigma[i] * noise[i],
                              atol=1e-6)
        per_clip.append((seen["out"][i] - (noise[i] - clean)).pow(2).mean())
    return torch.stack(per_clip).mean(), per_clip


def test_the_loss_is_video_plus_multiplier_times_audio(model: LTX2Model) -> None:
    batch = sound_batch(model, [True, True])
    audio, _ = hand_audio_loss(model, batch, micro=4, step=7)
    with torch.no_grad():
        model.begin_micro_step(4)
        total = compute_loss(model, batch, step_generator(1, 7, 0))
        model.begin_micro_step(4)
        video_only = compute_loss(model, DataBatch(
            captions=batch.captions, latents=batch.latents,
            prompt_embeds=batch.prompt_embeds), step_generator(1, 7, 0))
        model.configure_training(train_cfg(timestep_type="shift", audio_loss_multiplier=0.0))
        model.begin_micro_step(4)
        zero = compute_loss(model, batch, step_generator(1, 7, 0))
    assert audio > 0.1
    assert torch.allclose(total, zero + 0.5 * audio, atol=1e-5)
    # The video term sees the clips' sound through the cross-modal attention, so it is not
    # the silent batch's; its value is what a zero multiplier leaves.
    assert not torch.allclose(zero, video_only)
    assert model.side_loss() is None  # taken once


def test_a_clip_without_sound_trains_video_only(model: LTX2Model) -> None:
    batch = sound_batch(model, [True, False])
    audio, per_clip = hand_audio_loss(model, batch, micro=2, step=3)
    assert len(per_clip) == 1  # only the clip with sound is scored
    with torch.no_grad():
        model.begin_micro_step(2)
        total = compute_loss(model, batch, step_generator(1, 3, 0))
        model.configure_training(train_cfg(timestep_type="shift", audio_loss_multiplier=0.0))
        model.begin_micro_step(2)
        zero = compute_loss(model, batch, step_generator(1, 3, 0))
    assert torch.allclose(total, zero + 0.5 * per_clip[0], atol=1e-5)
    # A batch where no clip has sound is the silent path: no side loss at all.
    silent = sound_batch(model, [False, False])
    assert silent.audio_latents is None
    model.get_noise_prediction(*_inputs(model, silent), batch=silent)
    assert model.side_loss() is None


def _inputs(model: LTX2Model, batch: DataBatch) -> tuple[Any, Any, Any]:
    s = draw(model, batch, step_generator(1, 0, 0))
    return s.model_input, s.x.timesteps, s.embeds


# The modules that reach only the audio output (one block): audio_attn1/2 do not, they
# feed the video tokens through audio_to_video_attn (measured: non-zero grads on a
# silent batch), so a video loss alone trains them too.
AUDIO_ONLY = ("audio_ff.", "video_to_audio_attn.")


def audio_only_grads(model: LTX2Model, batch: DataBatch) -> dict[str, float]:
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    with torch.no_grad():
        for p in network.trainable_parameters():  # B starts at zero: give both values
            p.normal_(0.0, 0.05)
    model.begin_micro_step(1)
    compute_loss(model, batch, step_generator(1, 1, 0)).backward()
    return {name: float(p.grad.abs().max()) if p.grad is not None else 0.0
            for name, p in model.model.named_parameters()
            if "lora_" in name and any(part in name for part in AUDIO_ONLY)}


def test_audio_only_lora_modules_learn_only_from_sound(ltx_dir: Path) -> None:
    def fresh() -> LTX2Model:
        m = load_model(model_cfg(ARCH, ltx_dir))
        m.configure_training(train_cfg(timestep_type="shift", audio_loss_multiplier=1.0))
        return m

    silent_model = fresh()
    silent = audio_only_grads(silent_model, sound_batch(silent_model, [False, False]))
    sound_model = fresh()
    heard = audio_only_grads(sound_model, sound_batch(sound_model, [True, False]))
    assert silent and silent.keys() == heard.keys()
    assert all(g == 0.0 for g in silent.values())
    assert any(g > 0.0 for name, g in heard.items() if "lora_B" in name)


# ---- the batch source, without a cache; an arch without sound --------------------------
def test_uncached_batches_carry_each_clips_audio_latents(model: LTX2Model,
                                                         sound_dataset: Path,
                                                         monkeypatch) -> None:
    from aitk.data.batches import BatchSource
    from aitk.data.cache import ItemAudio

    said: list[str] = []
    items = list(scanned(sound_dataset, ClipSpec(FRAMES, audio=True)).values())
    source = BatchSource(items, 2, 0, None, model.encode_images, model.get_prompt_embeds,
                         audio=ItemAudio(model, said.append))
    batch = source.next()
    sounds = dict(zip((Path(f).name for f in batch.file_paths), batch.audio_latents or [],
                      strict=True))
    assert sounds["mute.mp4"] is None and sounds["tone.mp4"].shape == (9, 8)
    assert said == [f"{sound_dataset / 'mute.mp4'}: no audio track; this clip trains "
                    "video only"]
    source.next()
    assert len(said) == 1  # once per file, not per draw
    # A soundtrack FFmpeg cannot decode is said once too and trains video only.
    import aitk.data.audio as audio_module
    from aitk.errors import UnreadableVideo

    def broken(*args: Any) -> None:
        raise UnreadableVideo("its audio cannot be decoded (Invalid data)")

    monkeypatch.setattr(audio_module, "read_audio", broken)
    assert ItemAudio(model, said.append)(items[0]) is None
    monkeypatch.undo()
    assert said[-1] == (f"{items[0].path}: its audio cannot be decoded (Invalid data); this "
                        "clip trains video only")
    # Without do_audio the batch carries no sound at all.
    plain = BatchSource(list(scanned(sound_dataset, ClipSpec(FRAMES)).values()), 2, 0,
                        None, model.encode_images, model.get_prompt_embeds,
                        audio=ItemAudio(model, said.append)).next()
    assert plain.audio_latents is None


def test_an_arch_without_sound_ignores_do_audio_with_one_line(sound_dataset: Path) -> None:
    from types import SimpleNamespace

    from aitk.config.schema import DatasetConfig
    from aitk.run.assembly import scan_datasets

    ds = DatasetConfig(folder_path=str(sound_dataset), num_frames=FRAMES, resolution=[SIDE],
                       do_audio=True)
    proc = SimpleNamespace(datasets=[ds], model=SimpleNamespace(arch="wan21"),
                           trigger_word=None)
    said: list[str] = []
    items = scan_datasets(proc, 32, said.append, is_video=True, audio=False)
    assert items and all(i.audio is None for i in items)
    assert said == ["datasets[0].do_audio: arch 'wan21' trains no sound; its videos train "
                    "without their audio"]
    with_sound = scan_datasets(proc, 32, said.append, is_video=True, audio=True)
    assert all(i.audio is not None for i in with_sound)


# ---- the job: cache, a silent clip, resume, the mp4 preview ----------------------------
def sound_job(tmp: Path, model_dir: Path, dataset: Path, name: str = "s") -> Path:
    return write_lora_job(
        tmp, name, ARCH, model_dir,
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3,
               "timestep_type": "shift", "audio_loss_multiplier": 0.7},
        sample=last_step_sample(width=SIDE, height=SIDE, guidance_scale=1.0,
                                num_frames=FRAMES, fps=24),
        datasets=[{"folder_path": str(dataset), "resolution": [SIDE], "num_frames": FRAMES,
                   "do_audio": True, "cache_latents_to_disk": True}])


@pytest.fixture(scope="module")
def sound_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sound-ds")
    make_clip(folder / "tone.mp4", caption="a tone")
    make_clip(folder / "mute.mp4", tone=None, caption="a mute clip")
    return folder


@pytest.fixture(scope="module")
def sound_run(tmp_path_factory: pytest.TempPathFactory, ltx_dir: Path,
              sound_dataset: Path) -> tuple[Path, str]:
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("ltx2-sound-run")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as mp:
        mp.setenv("AITK_CACHE_DIR", str(tmp / "cache"))  # the run's own: the test reads it
        assert cli_main([str(sound_job(tmp, ltx_dir, sound_dataset))]) == 0
    return tmp / "out" / "s", err.getvalue()


def test_the_job_trains_with_sound_and_says_the_silent_clip_once(sound_run: tuple[Path, str]
                                                                 ) -> None:
    out, log = sound_run
    said = [line for line in log.splitlines() if "no audio track" in line]
    assert len(said) == 1 and "mute.mp4" in said[0] and "video only" in said[0]
    assert "Traceback" not in log and "do_audio" not in log  # acted on, not ignored
    losses = [json.loads(x)["loss"] for x in (out / "loss_log.jsonl").read_text().splitlines()]
    assert len(losses) == STEPS and all(np.isfinite(losses))
    assert (out / "s.safetensors").is_file()


def test_the_audio_latents_are_cached_with_the_clips_latents(sound_run: tuple[Path, str]
                                                            ) -> None:
    cache = sound_run[0].parents[1] / "cache" / "latents"
    entries = [load_file(p) for p in cache.rglob("*.safetensors")]
    with_sound = [e for e in entries if "audio" in e]
    assert with_sound and all(e["audio"].shape == (9, 8) for e in with_sound)
    assert any("audio" not in e and e["latent"].shape[1] == 2 for e in entries)  # mute


def test_the_preview_is_an_mp4_with_an_audio_stream(sound_run: tuple[Path, str]) -> None:
    out, _ = sound_run
    mp4 = out / "samples" / f"{STEPS:09d}_0.mp4"
    assert mp4.is_file() and (out / "samples" / f"{STEPS:09d}_0.webp").is_file()
    probe = subprocess.run([ffmpeg(), "-hide_banner", "-i", str(mp4)], capture_output=True,
                           text=True).stderr  # no output file: ffmpeg lists the streams
    assert re.search(r"Stream #0:\d.*Video: h264", probe)
    audio = re.search(r"Stream #0:\d.*Audio: aac.*?(\d+) Hz", probe)
    assert audio and int(audio[1]) == RATE
    import av

    with av.open(str(mp4)) as container:
        assert container.metadata.get("comment") == "aitk"
        stream = container.streams.audio[0]
        samples = sum(f.samples for f in container.decode(stream))
    # the tiny vocoder makes the clip's length of sound: 9 frames at 24 fps
    assert abs(samples / RATE - FRAMES / 24) < 0.1


def test_ctrl_c_then_resume_with_sound_gives_the_uninterrupted_weights(
        sound_run: tuple[Path, str], tmp_path: Path, ltx_dir: Path, sound_dataset: Path,
        monkeypatch) -> None:
    out, _ = sound_run
    interrupt_via_sigint_then_resume([str(sound_job(tmp_path, ltx_dir, sound_dataset))],
                                     monkeypatch)
    assert_same_weights(tmp_path / "out" / "s" / "s.safetensors", out / "s.safetensors")
