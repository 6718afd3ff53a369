"""A video job end to end, in process, on a video arch (the example arch run frame by
frame): clips and an image train together, a corrupt video is reported once and the job
goes on, latents are cached as 5-D entries, previews are animated WebPs with strips."""

from __future__ import annotations

import io
import os
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image
from safetensors.torch import load_file

from aitk.config.loading import load_config
from aitk.errors import EXIT_OK
from aitk.models import catalog
from aitk.models.description import Capabilities, Frames
from aitk.run.job import run_job
from tests.aitk.aitk_testing import job_config, write_config, write_image
from tests.aitk.data.videos import write_video

pytestmark = pytest.mark.slow


@pytest.fixture
def video_arch(monkeypatch):
    """A built-in `framed_example` arch for this test: the example's description with
    a video frame rule and the test's class."""
    known = catalog.builtin_descriptions()
    framed = replace(known["example"], name="framed_example",
                     model_class="tests.aitk.data.videos:FramedExample",
                     capabilities=Capabilities(video=Frames(4)))
    monkeypatch.setattr(catalog, "builtin_descriptions",
                        lambda: {**known, framed.name: framed})


def test_a_video_job_trains_caches_and_previews_past_a_corrupt_video(
        tmp_path: Path, example_model_dir: Path, video_arch):
    data = tmp_path / "clips"
    write_video(data / "a.mp4", 9, caption="a grey clip")
    write_video(data / "b.webm", 13, caption="another clip")
    write_image(data / "still.png", (32, 32), caption="a still")
    (data / "broken.mp4").write_bytes(os.urandom(2048))
    (data / "broken.txt").write_text("never read")
    cfg = job_config("clips", tmp_path / "out", example_model_dir, steps=3,
                     datasets=[{"folder_path": str(data), "resolution": [32],
                                "num_frames": 5, "cache_latents_to_disk": True}],
                     model={"arch": "framed_example", "name_or_path": str(example_model_dir)},
                     train={"batch_size": 1},
                     sample={"sample_every": 3, "prompts": ["a clip"], "num_frames": 5,
                             "fps": 8, "format": "jpg"})
    loaded = load_config(str(write_config(tmp_path / "clips.yml", cfg)))
    assert loaded.warnings == []
    log = io.StringIO()
    assert run_job(loaded, log) == EXIT_OK, log.getvalue()
    out = log.getvalue()
    assert out.count("broken.mp4") == 1 and "unusable video, skipped" in out
    entries = sorted((Path(os.environ["AITK_CACHE_DIR"]) / "latents").rglob("*.safetensors"))
    shapes = sorted(tuple(load_file(p)["latent"].shape) for p in entries)
    assert len(shapes) == 3 and all(len(s) == 4 for s in shapes)  # (C, f, h, w) each
    assert sorted(s[1] for s in shapes) == [1, 5, 5]  # the image is a 1-frame clip
    samples = tmp_path / "out" / "clips" / "samples"
    assert sorted(p.name for p in samples.iterdir()) == [
        "000000000_0.jpg", "000000000_0.webp", "000000003_0.jpg", "000000003_0.webp"]
    with Image.open(samples / "000000003_0.webp") as anim:
        assert anim.n_frames == 5
