"""Video datasets: real files written and decoded through PyAV; which frames a clip
takes; bad videos reported once and skipped; 5-D batches and latent-cache entries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from aitk.config.schema import DatasetConfig, ProcessConfig
from aitk.data import dataset as dataset_module
from aitk.data.batches import BatchSource
from aitk.data.cache import LatentCache
from aitk.data.dataset import load_pixels, scan_folder
from aitk.data.video import ClipSpec, VideoInfo, frame_indices, spread
from aitk.errors import ConfigError, DatasetError, UnreadableVideo
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from tests.aitk.aitk_testing import model_settings, write_image
from tests.aitk.data.videos import VideoModel, frame_numbers, write_video


def scan(folder: Path, clip: ClipSpec | None, reports: list[str] | None = None):
    return scan_folder(folder, resolutions=[32], divisibility=8, clip=clip,
                       report=(reports.append if reports is not None else print))


@pytest.fixture
def video_model() -> VideoModel:
    model = VideoModel(model_settings(arch="tiny_video"))
    model.load_model()
    return model


# ---- which frames: pure ----------------------------------------------------------------
def test_spread_takes_both_ends_and_even_steps():
    assert spread(17, 5) == [0, 4, 8, 12, 16]
    assert spread(10, 5) == [0, 2, 5, 7, 9]  # 2.25 apart, rounded half up
    assert spread(5, 5) == [0, 1, 2, 3, 4]
    assert spread(40, 1) == [0]


def test_fps_mode_takes_consecutive_frames_at_the_rate_and_falls_back_to_spread():
    at_12 = ClipSpec(5, fps=12, shrink=False)
    assert frame_indices(VideoInfo(32, 32, 17, 24.0), at_12) == (0, 2, 4, 6, 8)
    assert frame_indices(VideoInfo(32, 32, 17, 10.0), at_12) == (0, 1, 2, 3, 4)  # no upsampling
    assert frame_indices(VideoInfo(32, 32, 8, 24.0), at_12) == (0, 2, 4, 5, 7)  # too short
    assert frame_indices(VideoInfo(32, 32, 17, None), at_12) == (0, 1, 2, 3, 4)


def test_a_video_shorter_than_num_frames_is_refused():
    with pytest.raises(UnreadableVideo, match="4 frames, fewer than num_frames 5"):
        frame_indices(VideoInfo(32, 32, 4, 24.0), ClipSpec(5))


def _wan21_with_frames(frames: int) -> list[str]:
    from aitk.config.loading import parse_job
    from tests.aitk.test_config import example_raw, proc

    raw = example_raw()
    proc(raw)["model"]["arch"] = "wan21"
    proc(raw)["datasets"][0]["num_frames"] = frames
    try:
        parse_job(raw, "job.yml", env={}, check_arch=None)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("frames", [2, 4, 6, 16, 18])
def test_num_frames_off_the_video_archs_rule_is_a_config_error(frames):
    [problem] = _wan21_with_frames(frames)
    assert problem.startswith("config.process[0].datasets[0].num_frames: must be 1 or of "
                              "the form 4k+1")
    for good in (1, 5, 17, 81):
        assert _wan21_with_frames(good) == []
    with pytest.raises(ValueError):  # below one frame: the schema's own bound
        DatasetConfig(folder_path="x", num_frames=0)


def test_video_keys_are_read_not_warned_about():
    from tests.aitk.test_config import example_raw, parse, proc

    raw = example_raw()
    proc(raw)["datasets"][0].update(num_frames=17, fps=16, shrink_video_to_frames=False)
    proc(raw)["sample"].update(num_frames=33, fps=12)
    proc(raw)["sample"]["samples"] = [{"prompt": "a", "num_frames": 9, "fps": 8}]
    loaded = parse(raw)
    assert loaded.warnings == []
    ds = loaded.job.config.process[0].datasets[0]
    assert (ds.num_frames, ds.fps, ds.shrink_video_to_frames) == (17, 16, False)
    assert _wan21_with_frames(16) == [
        "config.process[0].datasets[0].num_frames: must be 1 or of the form 4k+1 (1, 5, 9, "
        "13, 17, ...); got 16: use 13 or 17"]  # a video arch: its frame rule (Wan's 4k+1)


# ---- decoding real files ---------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".mp4", ".webm"])
def test_frames_are_spread_over_the_whole_clip(tmp_path: Path, suffix: str):
    write_video(tmp_path / "ds" / f"clip{suffix}", 17, caption="a clip")
    [item] = scan(tmp_path / "ds", ClipSpec(5))
    assert (item.size, item.bucket, item.frames) == ((32, 32), (32, 32), (0, 4, 8, 12, 16))
    pixels = load_pixels(item)
    assert pixels.shape == (3, 5, 32, 32)
    assert frame_numbers(pixels) == [0, 4, 8, 12, 16]
    assert -1.0 <= float(pixels.min()) and float(pixels.max()) <= 1.0


def test_fps_mode_decodes_consecutive_frames_at_the_rate(tmp_path: Path):
    write_video(tmp_path / "ds" / "clip.mkv", 17, fps=24)
    [item] = scan(tmp_path / "ds", ClipSpec(5, fps=12, shrink=False))
    assert frame_numbers(load_pixels(item)) == [0, 2, 4, 6, 8]


def test_fps_mode_on_a_short_clip_spreads_it_and_says_so_once(tmp_path: Path):
    write_video(tmp_path / "ds" / "short.mov", 9, fps=24, caption="short")
    reports: list[str] = []
    [item] = scan(tmp_path / "ds", ClipSpec(5, fps=6, shrink=False), reports)
    assert frame_numbers(load_pixels(item)) == [0, 2, 4, 6, 8]
    assert reports == [f"{tmp_path / 'ds' / 'short.mov'}: 9 frames are too few for 5 at 6 fps; "
                       "spread over the whole clip instead"]


def test_buckets_use_the_frame_size(tmp_path: Path):
    write_video(tmp_path / "ds" / "wide.mp4", 5, size=(64, 32))
    [item] = scan_folder(tmp_path / "ds", resolutions=[32], divisibility=8, clip=ClipSpec(5))
    assert (item.size, item.bucket) == ((64, 32), (40, 16))
    assert load_pixels(item).shape == (3, 5, 16, 40)


def test_images_are_one_frame_clips_for_a_video_arch_and_batch_apart(tmp_path: Path):
    folder = tmp_path / "ds"
    write_image(folder / "still.png", (32, 32))
    write_video(folder / "clip.webm", 9)
    items = {i.path.name: i for i in scan(folder, ClipSpec(9))}
    assert items["still.png"].frames == (0,)
    assert load_pixels(items["still.png"]).shape == (3, 1, 32, 32)
    assert items["still.png"].group != items["clip.webm"].group
    [image_arch] = scan(folder, None, [])
    assert image_arch.frames is None and load_pixels(image_arch).shape == (3, 32, 32)


def test_with_num_frames_1_videos_are_skipped_with_one_report(tmp_path: Path):
    folder = tmp_path / "ds"
    write_image(folder / "still.png", (32, 32), caption="still")
    write_video(folder / "a.mp4", 5)
    write_video(folder / "b.mp4", 5)
    for clip in (None, ClipSpec(1)):
        reports: list[str] = []
        assert [i.path.name for i in scan(folder, clip, reports)] == ["still.png"]
        assert reports == [f"{folder}: 2 video files skipped (num_frames is 1: images only; "
                           "a video arch with num_frames 4k+1 trains on videos)"]


def test_an_image_arch_refuses_num_frames_above_1(tmp_path: Path):
    from aitk.run.assembly import scan_datasets

    write_video(tmp_path / "ds" / "a.mp4", 5)
    proc = ProcessConfig.model_validate({
        "network": {"type": "lora"}, "model": {"arch": "flux", "name_or_path": "x"},
        "datasets": [{"folder_path": str(tmp_path / "ds"), "num_frames": 5}]})
    with pytest.raises(DatasetError) as info:
        scan_datasets(proc, 8, print, is_video=False)
    assert str(info.value) == ("datasets[0].num_frames is 5, but arch 'flux' trains on "
                               "images; set num_frames: 1 or use a video arch")
    assert info.value.exit_code == 2
    assert len(scan_datasets(proc, 8, print, is_video=True)) == 1


# ---- bad videos: reported once, skipped, the rest goes on ------------------------------
def test_corrupt_truncated_and_short_videos_are_skipped_with_one_message_each(tmp_path: Path):
    folder = tmp_path / "ds"
    write_video(folder / "good.mp4", 9, caption="fine")
    (folder / "garbage.mp4").write_bytes(os.urandom(4096))
    whole = write_video(tmp_path / "whole.mp4", 9).read_bytes()
    (folder / "cut.mp4").write_bytes(whole[:len(whole) // 2])  # mp4's index is at the end
    (folder / "empty.webm").write_bytes(b"")
    write_video(folder / "short.webm", 3)
    reports: list[str] = []
    items = scan(folder, ClipSpec(5), reports)
    assert [i.path.name for i in items] == ["good.mp4"]
    assert len(reports) == 4, reports
    for name in ("garbage.mp4", "cut.mp4", "empty.webm"):
        assert any(r.startswith(f"{folder / name}: unusable video, skipped (") for r in reports)
    assert f"{folder / 'short.webm'}: unusable video, skipped (3 frames, fewer than " \
           "num_frames 5)" in reports
    assert frame_numbers(load_pixels(items[0])) == [0, 2, 4, 6, 8]  # the rest still loads


def test_a_folder_of_only_bad_videos_is_an_error_naming_videos(tmp_path: Path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "bad.mkv").write_bytes(b"nope")
    with pytest.raises(DatasetError, match="has no usable images or videos"):
        scan(tmp_path / "ds", ClipSpec(5), [])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_fifo_folder_oversize_and_huge_frame_videos_are_refused(tmp_path: Path,
                                                                 monkeypatch):
    folder = tmp_path / "ds"
    good = write_video(folder / "good.mp4", 5, caption="good")
    os.mkfifo(folder / "fifo.mp4")  # opened non-blocking and refused, never waited on
    (folder / "dir.webm").mkdir()
    (folder / "dev.mov").symlink_to("/dev/zero")
    limit = good.stat().st_size
    (folder / "big.mkv").write_bytes(os.urandom(limit + 1))  # refused before it is read
    monkeypatch.setattr(dataset_module, "MAX_VIDEO_BYTES", limit)
    reports: list[str] = []
    assert [i.path.name for i in scan(folder, ClipSpec(5), reports)] == ["good.mp4"]
    for name in ("fifo.mp4", "dir.webm", "dev.mov"):
        assert f"{folder / name}: skipped (not a regular file: {folder / name})" in reports
    assert f"{folder / 'big.mkv'}: skipped ({limit + 1} bytes, more than the {limit}-byte " \
           "limit)" in reports
    assert len([r for r in reports if "caption" not in r]) == 4, reports

    (folder / "big.mkv").unlink()
    write_video(folder / "huge.mkv", 5, size=(64, 32))
    monkeypatch.setattr(dataset_module, "MAX_VIDEO_BYTES", 2**30)
    monkeypatch.setattr(dataset_module, "MAX_IMAGE_PIXELS", 32 * 32)
    reports = []
    assert [i.path.name for i in scan(folder, ClipSpec(5), reports)] == ["good.mp4"]
    assert (f"{folder / 'huge.mkv'}: unusable video, skipped (64x32 pixels a frame, more "
            f"than the 1024-pixel limit)") in reports


# ---- 5-D batches and the latent cache --------------------------------------------------
def embeds(captions: list[str]) -> AdvancedPromptEmbeds:
    return AdvancedPromptEmbeds(text_embeds=[torch.zeros(1, 8) for _ in captions])


@pytest.fixture
def clip_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "clips"
    write_video(folder / "a.mp4", 17, caption="clip a")
    write_video(folder / "b.webm", 9, caption="clip b")
    return folder


def test_batches_carry_5d_latents(video_model, clip_folder: Path):
    items = scan(clip_folder, ClipSpec(9))
    source = BatchSource(items, 2, 0, None, video_model.encode_images, embeds)
    batch = source.next()
    assert batch.latents is not None and batch.latents.shape == (2, 3, 9, 16, 16)
    assert sorted(batch.captions) == ["clip a", "clip b"]


def test_latent_cache_holds_5d_entries_keyed_by_the_frames(video_model, clip_folder: Path,
                                                           tmp_path: Path):
    def cache() -> LatentCache:
        return LatentCache(video_model.encode_images, "tiny-video", "1", tmp_path / "c")

    items = scan(clip_folder, ClipSpec(9))
    first = cache()
    first.fill(items)
    assert first.computed == 2
    source = BatchSource(items, 2, 0, first.get, video_model.encode_images, embeds)
    latents = source.next().latents
    assert latents is not None and latents.shape == (2, 3, 9, 16, 16)
    direct = video_model.encode_images(load_pixels(items[0]).unsqueeze(0))[0]
    assert torch.equal(first.get(items[:1])[0], direct)
    again = cache()
    again.fill(scan(clip_folder, ClipSpec(9)))
    assert again.computed == 0  # read from disk
    fewer = cache()
    fewer.fill(scan(clip_folder, ClipSpec(5)))
    assert fewer.computed == 2  # other frames: other entries
    # At 24 fps the 17-frame clip takes frames 0..8, not every other one; the 9-frame
    # clip takes all its frames either way, so its entry is shared.
    at_rate = cache()
    at_rate.fill(scan(clip_folder, ClipSpec(9, fps=24, shrink=False)))
    assert at_rate.computed == 1


def test_image_cache_keys_are_unchanged_by_the_frames_field(tmp_path: Path):
    from dataclasses import asdict

    from aitk.data.buckets import resize_crop
    from aitk.data.cache import CACHE_FORMAT, _digest, latent_key

    write_image(tmp_path / "ds" / "a.png", (32, 32))
    [image_arch] = scan(tmp_path / "ds", None)
    [video_arch] = scan(tmp_path / "ds", ClipSpec(5))
    # An image arch's key is the one it had before video datasets (stored entries stay
    # valid); the same image as a 1-frame clip is another entry.
    before = _digest({"kind": "latent", "format": CACHE_FORMAT, "content": "c",
                      "processing": asdict(resize_crop(32, 32, (32, 32))),
                      "resample": "lanczos", "model": "m", "space": "1"})
    assert latent_key(image_arch, "c", "m", "1") == before
    assert latent_key(video_arch, "c", "m", "1") != before


def test_the_preflight_audit_counts_videos_when_num_frames_asks_for_them(tmp_path: Path):
    from aitk.audit.dataset import DatasetOptions, audit_dataset

    write_video(tmp_path / "ds" / "a.mp4", 5, caption="a clip")
    for_videos = audit_dataset(DatasetOptions(tmp_path / "ds", videos=True, quick=True))
    assert [f.code for f in for_videos.findings if f.level.name == "ERROR"] == []
    assert for_videos.summary["videos"] == 1
    assert "orphan_caption" not in {f.code for f in for_videos.findings}
    images_only = audit_dataset(DatasetOptions(tmp_path / "ds", quick=True))
    assert "no_images" in {f.code for f in images_only.findings}


def ffmpeg_program() -> str | None:
    import shutil

    from tests.aitk.aitk_testing import REPO

    local = REPO / ".ffmpeg" / "bin" / ("ffmpeg.exe" if os.name == "nt" else "ffmpeg")
    return str(local) if local.is_file() else shutil.which("ffmpeg")


@pytest.mark.skipif(ffmpeg_program() is None, reason="needs the ffmpeg program (manager "
                    "install provisions .ffmpeg/)")
def test_a_display_rotation_is_applied_as_ffmpeg_itself_shows_the_video(tmp_path: Path):
    import subprocess

    import av
    import numpy as np
    from PIL import Image

    source = tmp_path / "src.mp4"
    with av.open(str(source), "w") as container:  # 32x16, left half white
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 32, 16, "yuv420p"
        arr = np.zeros((16, 32, 3), np.uint8)
        arr[:, :16] = 255
        for _ in range(5):
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    ffmpeg = ffmpeg_program()
    assert ffmpeg is not None
    (tmp_path / "ds").mkdir()
    turned = tmp_path / "ds" / "turned.mp4"
    subprocess.run([ffmpeg, "-v", "error", "-display_rotation", "90", "-i", str(source),
                    "-c", "copy", str(turned)], check=True, timeout=120)
    shown = tmp_path / "shown.png"  # ffmpeg applies the rotation when it decodes
    subprocess.run([ffmpeg, "-v", "error", "-i", str(turned), "-frames:v", "1", str(shown)],
                   check=True, timeout=120)
    [item] = scan(tmp_path / "ds", ClipSpec(5), [])
    assert item.size == (16, 32)  # upright: portrait
    ours = ((load_pixels(item)[:, 0] + 1) * 127.5).mean(0).round().numpy()
    theirs = np.asarray(Image.open(shown).convert("L"), dtype=np.float32)
    assert ours.shape == theirs.shape == (32, 16)
    assert np.abs(ours - theirs).max() < 40


def test_the_shipped_example_video_dataset_scans_as_17_frame_clips():
    from aitk.audit.dataset import DatasetOptions, audit_dataset
    from tests.aitk.aitk_testing import REPO

    folder = REPO / "datasets" / "example_video"
    items = scan(folder, ClipSpec(17), [])
    assert sorted(i.path.suffix for i in items) == [".mkv", ".mp4", ".webm"]
    assert all(i.frames == tuple(range(17)) and i.size == (64, 48) for i in items)
    assert all(i.caption for i in items)
    report = audit_dataset(DatasetOptions(folder, videos=True, quick=True))
    assert report.summary["videos"] == 3
    assert not [f for f in report.findings if f.level.name == "ERROR"]


def test_audit_dataset_videos_flag_counts_the_clips(capsys):
    from aitk.cli.audit import main
    from tests.aitk.aitk_testing import REPO

    folder = REPO / "datasets" / "example_video"
    assert main(["dataset", str(folder), "--videos", "--json"]) == 0
    assert '"videos": 3' in capsys.readouterr().out
    assert main(["dataset", str(folder), "--json"]) != 0  # images only: none usable


# ---- auto_frame_count (upstream's meaning) ---------------------------------------------
def test_auto_frame_count_takes_the_videos_length_at_fps_snapped_to_4k_plus_1():
    auto = ClipSpec(1, fps=12, auto=True)
    # 40 frames at 24 fps = 1.67 s = 20 frames at 12 fps -> 17 (4k+1 inside the video)
    assert frame_indices(VideoInfo(32, 32, 40, 24.0), auto) == tuple(
        2 * i for i in range(17))
    # without trimming: 20 -> 21 frames, spread over the whole clip
    untrimmed = ClipSpec(1, fps=12, auto=True, trim_tail=False)
    assert frame_indices(VideoInfo(32, 32, 40, 24.0), untrimmed) == tuple(spread(40, 21))
    assert len(frame_indices(VideoInfo(32, 32, 3, 24.0), auto)) == 1  # too short: 1 frame


def test_auto_frame_count_clips_batch_by_their_own_length(tmp_path: Path):
    write_video(tmp_path / "ds" / "long.mp4", 16, fps=24, caption="long")
    write_video(tmp_path / "ds" / "short.mp4", 9, fps=24, caption="short")
    items = {i.path.name: i for i in scan(tmp_path / "ds", ClipSpec(1, fps=24, auto=True))}
    # 16 frames -> 13 (the 4k+1 inside the video), 9 -> 9
    assert len(items["long.mp4"].frames) == 13 and len(items["short.mp4"].frames) == 9
    assert frame_numbers(load_pixels(items["long.mp4"])) == list(range(13))
    assert items["long.mp4"].group != items["short.mp4"].group


def test_an_image_arch_refuses_auto_frame_count(tmp_path: Path):
    from aitk.run.assembly import Reporter, scan_datasets
    from tests.aitk.test_config import example_raw, parse, proc

    write_image(tmp_path / "ds" / "a.png", (32, 32))
    raw = example_raw()
    proc(raw)["datasets"] = [{"folder_path": str(tmp_path / "ds"), "auto_frame_count": True}]
    p = parse(raw).job.config.process[0]
    with pytest.raises(DatasetError, match=r"datasets\[0\].auto_frame_count is set, but arch "
                       "'example' trains on images"):
        scan_datasets(p, 8, Reporter(__import__("io").StringIO()))
