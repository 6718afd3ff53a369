"""Preview images: fixed prompts and seeds, names with the step, atomic writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from aitk.config.schema import SampleConfig, SampleItem
from aitk.run.sampling import image_configs, write_samples


def test_configs_follow_seed_walk_trigger_and_per_item_overrides():
    cfg = SampleConfig(prompts=["[trigger] a cat", "a dog"], seed=10, walk_seed=True,
                       width=64, height=32, guidance_scale=2.0, sample_steps=3, neg="blurry")
    out = image_configs(cfg, "sks")
    assert [c.prompt for c in out] == ["sks a cat", "a dog"]
    assert [c.seed for c in out] == [10, 11]
    assert (out[0].width, out[0].height, out[0].sample_steps) == (64, 32, 3)
    assert out[0].negative_prompt == "blurry"
    fixed = SampleConfig(samples=[SampleItem(prompt="x", seed=99, width=16), SampleItem(
        prompt="y")], seed=5, walk_seed=False)
    got = image_configs(fixed, None)
    assert [(c.seed, c.width) for c in got] == [(99, 16), (5, 512)]


def test_samples_are_written_with_the_step_and_leave_global_rng_alone(tiny_model,
                                                                      tmp_path: Path):
    configs = image_configs(SampleConfig(prompts=["a", "b"], width=16, height=16,
                                         sample_steps=2, walk_seed=True), None)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    paths = write_samples(tiny_model, configs, tmp_path / "samples", 250, "png")
    assert torch.equal(torch.rand(1), expected_next)
    assert [p.name for p in paths] == ["000000250_0.png", "000000250_1.png"]
    again = write_samples(tiny_model, configs, tmp_path / "again", 250, "png")
    a, b = (np.asarray(Image.open(p)) for p in (paths[0], again[0]))
    assert np.array_equal(a, b)  # same prompt + seed, same image
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "000000250_0.png", "000000250_1.png"]  # no temp files left


# ---- video archs: an animated WebP and a frame strip -----------------------------------
def video_model():
    from tests.aitk.aitk_testing import model_settings
    from tests.aitk.data.videos import VideoModel

    model = VideoModel(model_settings(arch="tiny_video"))
    model.load_model()
    return model


def test_sample_num_frames_and_fps_reach_the_configs_with_per_item_overrides():
    cfg = SampleConfig(samples=[SampleItem(prompt="a"), SampleItem(prompt="b", num_frames=5,
                                                                   fps=8)],
                       num_frames=17, fps=12)
    assert [(c.num_frames, c.fps) for c in image_configs(cfg, None)] == [(17, 12), (5, 8)]
    plain = image_configs(SampleConfig(prompts=["x"]), None)[0]
    assert (plain.num_frames, plain.fps) == (1, 16)  # upstream's sample defaults


def test_a_video_preview_is_an_animated_webp_and_a_strip(tmp_path: Path):
    from tests.aitk.data.videos import STEP

    configs = image_configs(SampleConfig(prompts=["a"], width=16, height=8, num_frames=9,
                                         fps=10), None)
    paths = write_samples(video_model(), configs, tmp_path / "samples", 20, "jpg")
    assert [p.name for p in paths] == ["000000020_0.webp", "000000020_0.jpg"]
    with Image.open(paths[0]) as anim:
        assert anim.format == "WEBP" and anim.is_animated and anim.n_frames == 9
        reds = []
        for i in range(anim.n_frames):
            anim.seek(i)
            reds.append(round(anim.convert("RGB").getpixel((8, 4))[0] / STEP))
            assert anim.info["duration"] == 100  # 1 / fps, read once the frame is loaded
        assert reds == list(range(9))
    with Image.open(paths[1]) as strip:
        assert strip.format == "JPEG" and strip.size == (5 * 16, 8)
        firsts = [round(strip.getpixel((16 * n + 8, 4))[0] / STEP) for n in range(5)]
        assert firsts == [0, 2, 4, 6, 8]  # evenly spaced, both ends
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "000000020_0.jpg", "000000020_0.webp"]  # no temp files left


def test_with_webp_format_the_strip_gets_its_own_name(tmp_path: Path):
    configs = image_configs(SampleConfig(prompts=["a"], width=8, height=8, num_frames=3),
                            None)
    paths = write_samples(video_model(), configs, tmp_path, 0, "webp")
    assert [p.name for p in paths] == ["000000000_0.webp", "000000000_0_strip.webp"]
    with Image.open(paths[0]) as anim, Image.open(paths[1]) as strip:
        assert anim.n_frames == 3 and strip.size == (24, 8)

def test_a_sample_file_the_trainer_did_not_write_is_never_overwritten(tiny_model,
                                                                      tmp_path: Path):
    """Issue 14: only files the trainer recognises as its own (its `Software` mark)
    are overwritten; someone else's file at a preview's name is left as it is."""
    configs = image_configs(SampleConfig(prompts=["a", "b"], width=16, height=16,
                                         sample_steps=2), None)
    folder = tmp_path / "samples"
    folder.mkdir()
    (folder / "000000250_0.png").write_bytes(b"the user's picture")
    said: list[str] = []

    paths = write_samples(tiny_model, configs, folder, 250, "png", say=said.append)

    assert (folder / "000000250_0.png").read_bytes() == b"the user's picture"
    assert [p.name for p in paths] == ["000000250_1.png"]
    assert said == [f"{folder / '000000250_0.png'} was not written by aitk; left as it is "
                    "(no preview written there)"]
    # Its own previews (a resumed run sampling that step again) are rewritten.
    ours = folder / "000000250_1.png"
    before = ours.stat().st_ino
    assert write_samples(tiny_model, configs, folder, 250, "png", say=said.append) == [ours]
    assert ours.stat().st_ino != before  # a new file, published by rename


def test_every_sample_format_carries_the_trainers_mark(tiny_model, tmp_path: Path):
    from aitk.run.ownership import image_is_ours as written_by_aitk

    configs = image_configs(SampleConfig(prompts=["a"], width=16, height=16,
                                         sample_steps=2), None)
    for fmt in ("png", "jpg", "webp"):
        [path] = write_samples(tiny_model, configs, tmp_path / fmt, 1, fmt)
        assert written_by_aitk(path), fmt
        plain = tmp_path / f"plain.{fmt}"
        Image.open(path).save(plain)  # the same picture, saved by someone else
        assert not written_by_aitk(plain), fmt
    link = tmp_path / "link.png"
    link.symlink_to(tmp_path / "png" / "000000001_0.png")
    assert not written_by_aitk(link)  # replacing a link would replace the user's link


def test_a_preview_with_sound_is_also_an_mp4_with_its_soundtrack(tmp_path: Path,
                                                                monkeypatch):
    """A VideoWithSound preview (LTX-2's): the WebP and strip as for any video, plus an
    mp4 of its frames and sound, aitk's mark in the container; someone else's mp4 at
    that name is left alone, aitk's own is rewritten."""
    import av

    from aitk.models.base import VideoWithSound

    model = video_model()
    frames_only = model.generate_images
    t = np.arange(8000) / 16000
    tone = (0.5 * np.stack([np.sin(2 * np.pi * 440 * t)] * 2)).astype(np.float32)

    def with_sound(configs, prompt_embeds=None):
        return [VideoWithSound(f, tone, 16000)
                for f in frames_only(configs, prompt_embeds=prompt_embeds)]

    monkeypatch.setattr(model, "generate_images", with_sound)
    configs = image_configs(SampleConfig(prompts=["a"], width=16, height=8, num_frames=9,
                                         fps=10), None)
    folder = tmp_path / "samples"
    paths = write_samples(model, configs, folder, 20, "jpg")
    assert [p.name for p in paths] == ["000000020_0.webp", "000000020_0.jpg",
                                       "000000020_0.mp4"]
    with av.open(str(paths[2])) as container:
        assert container.metadata.get("comment") == "aitk"
        video = container.streams.video[0]
        assert (video.codec_context.name, video.width, video.height) == ("h264", 16, 8)
        assert sum(1 for _ in container.decode(video)) == 9
    with av.open(str(paths[2])) as container:
        stream = container.streams.audio[0]
        assert (stream.codec_context.name, stream.rate, stream.channels) == ("aac", 16000, 2)
        pcm = np.concatenate([f.to_ndarray() for f in container.decode(stream)], axis=1)
    assert abs(pcm.shape[1] - 8000) < 2048  # AAC's priming and frame padding
    spectrum = np.abs(np.fft.rfft(pcm[0]))
    assert abs(np.fft.rfftfreq(pcm.shape[1], 1 / 16000)[spectrum.argmax()] - 440) < 10
    said: list[str] = []
    paths[2].write_bytes(b"the user's video")
    assert write_samples(model, configs, folder, 20, "jpg", say=said.append) == paths[:2]
    assert paths[2].read_bytes() == b"the user's video" and len(said) == 1
    paths[2].unlink()
    write_samples(model, configs, folder, 20, "jpg")
    before = paths[2].stat().st_ino
    assert write_samples(model, configs, folder, 20, "jpg") == paths  # ours: rewritten
    assert paths[2].stat().st_ino != before
