"""`python -m aitk caption` on a tiny random Qwen2.5-VL built locally (conftest.py): which
files it captions, what it keeps, the trigger prefix, the status file, the stop, and
one-line errors. The captions are noise; these tests check the plumbing.

In-process through the command's `main` (the same argv a shell passes), except the
slow test at the end, which starts the command as a process and stops it with SIGINT.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aitk.caption import job
from aitk.caption.settings import CaptionSettings
from aitk.cli.caption import main
from aitk_common.status import Phase, read_status
from tests.aitk.aitk_testing import REPO, write_image
from tests.aitk.data.videos import write_video

FAST = ["--max-new-tokens", "4"]  # noise either way; fewer tokens, quicker tests


def captions(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.txt"))}


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def caption(dataset: Path, model: Path, *extra: str) -> int:
    return main([str(dataset), "--model", str(model), *FAST, *extra])


def test_captions_only_the_files_without_one_and_keeps_the_rest(
        dataset: Path, tiny_vlm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert caption(dataset, tiny_vlm) == 0
    written = captions(dataset)
    assert sorted(written) == ["a.txt", "b.txt", "c.txt"]
    assert written["b.txt"] == "a green thing, by hand"
    assert written["a.txt"].strip() and written["c.txt"].strip()
    out = capsys.readouterr().out
    assert "captioned 1/2: a.png" in out and "captioned 2/2: c.jpg" in out
    assert "b.png" not in out and no_temp_files(dataset)
    # Run again: nothing left to caption, nothing touched, no model needed.
    before = {p: p.stat().st_mtime_ns for p in dataset.glob("*.txt")}
    assert main([str(dataset), "--model", str(dataset / "no such model")]) == 0
    assert "nothing to caption" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in dataset.glob("*.txt")} == before


def test_a_qwen3_vl_model_captions_through_the_same_command(
        dataset: Path, tiny_qwen3_vl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert caption(dataset, tiny_qwen3_vl, "--trigger", "ohwx") == 0
    assert sorted(captions(dataset)) == ["a.txt", "b.txt", "c.txt"]
    assert captions(dataset)["c.txt"].startswith("ohwx")
    assert "captioned 2/2: c.jpg" in capsys.readouterr().out


def test_overwrite_captions_every_file_again(dataset: Path, tiny_vlm: Path) -> None:
    (dataset / "a.txt").write_text("old caption")
    assert caption(dataset, tiny_vlm, "--overwrite") == 0
    written = captions(dataset)
    assert sorted(written) == ["a.txt", "b.txt", "c.txt"]
    assert "old caption" not in written.values()
    assert "a green thing, by hand" not in written.values()


def test_the_trigger_word_is_the_prefix_of_every_new_caption(
        dataset: Path, tiny_vlm: Path) -> None:
    assert caption(dataset, tiny_vlm, "--trigger", "ohwx") == 0
    written = captions(dataset)
    assert written["a.txt"].startswith("ohwx") and written["c.txt"].startswith("ohwx")
    assert written["b.txt"] == "a green thing, by hand"


def test_an_empty_caption_file_counts_as_none_and_limit_caps_the_run(
        dataset: Path, tiny_vlm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (dataset / "c.txt").write_text("")
    assert caption(dataset, tiny_vlm, "--limit", "1") == 0
    assert sorted(captions(dataset)) == ["a.txt", "b.txt", "c.txt"]
    assert (dataset / "c.txt").read_text() == ""  # left for a later run by --limit
    assert "1 left for later by --limit" in capsys.readouterr().out
    assert caption(dataset, tiny_vlm) == 0
    assert (dataset / "c.txt").read_text().strip()


def test_a_video_is_captioned_from_its_first_frame(tmp_path: Path, tiny_vlm: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_video(tmp_path / "clip.mp4", frames=5)
    assert caption(tmp_path, tiny_vlm) == 0
    assert (tmp_path / "clip.txt").read_text().strip()
    assert "captioned 1/1: clip.mp4" in capsys.readouterr().out


def test_an_unreadable_picture_is_skipped_and_said(dataset: Path, tiny_vlm: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (dataset / "a.png").write_bytes(b"not a png")
    assert caption(dataset, tiny_vlm) == 0
    assert not (dataset / "a.txt").exists() and (dataset / "c.txt").exists()
    out = capsys.readouterr().out
    assert "skipped 1/2: a.png (unreadable" in out and "1 skipped" in out


def test_the_status_file_follows_the_run(dataset: Path, tiny_vlm: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    status_file = dataset.parent / "job state" / "status.json"
    monkeypatch.setenv("AITK_STATUS_FILE", str(status_file))
    phases: list[tuple[str, int, int | None]] = []

    class Watched:
        """The real captioner, reading the status file before each picture."""

        def __init__(self, settings: CaptionSettings, device: str) -> None:
            self.inner = job.load_vlm(settings, device)

        def caption(self, picture):  # type: ignore[no-untyped-def]
            s = read_status(status_file)
            assert s is not None
            phases.append((s.phase.value, s.step, s.total_steps))
            return self.inner.caption(picture)

    settings = CaptionSettings(dataset, model=str(tiny_vlm), max_new_tokens=4)
    assert job.run(settings, say=lambda _: None, load=Watched).exit_code == 0
    assert phases == [("captioning", 0, 2), ("captioning", 1, 2)]
    final = read_status(status_file)
    assert final is not None and final.pid == os.getpid()
    assert (final.phase, final.step, final.total_steps, final.exit_code) == (
        Phase.FINISHED, 2, 2, 0)
    assert final.name == f"caption: {dataset}" and final.message == "captioned 2 of 2"


def test_a_stop_finishes_the_current_file_then_exits_130(
        dataset: Path, tiny_vlm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AITK_STATUS_FILE", str(dataset.parent / "status.json"))

    class StoppedDuringTheFirst:
        def __init__(self, settings: CaptionSettings, device: str) -> None:
            self.inner = job.load_vlm(settings, device)

        def caption(self, picture):  # type: ignore[no-untyped-def]
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C while the model works
            return self.inner.caption(picture)

    settings = CaptionSettings(dataset, model=str(tiny_vlm), max_new_tokens=4)
    outcome = job.run(settings, say=lambda _: None, load=StoppedDuringTheFirst)
    assert (outcome.exit_code, outcome.captioned, outcome.total) == (130, 1, 2)
    assert sorted(captions(dataset)) == ["a.txt", "b.txt"] and no_temp_files(dataset)
    final = read_status(dataset.parent / "status.json")
    assert final is not None and (final.phase, final.exit_code) == (Phase.STOPPED, 130)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def offline_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty hf home"))
    return ["--model", "Qwen/Qwen2.5-VL-7B-Instruct"]


def not_a_vlm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=8, n_head=1).save_pretrained(tmp_path / "gpt2")
    return ["--model", str(tmp_path / "gpt2")]


def no_model_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    (tmp_path / "empty model").mkdir()
    return ["--model", str(tmp_path / "empty model")]


@pytest.mark.parametrize(("where", "model", "message"), [
    ("missing", None, "dataset folder .*missing.* does not exist"),
    ("a file", None, "dataset folder .*a file.* is not a folder"),
    ("no pictures", None, "dataset folder .*no pictures.* has no images or videos"),
    ("ok", offline_hub_id, "cannot load the captioning model 'Qwen/Qwen2.5-VL-7B-Instruct'"
                           ".*HF_HUB_OFFLINE"),
    ("ok", not_a_vlm, "is a 'gpt2' model; captioning runs .*Qwen2.5-VL"),
    ("ok", no_model_files, "cannot load the captioning model folder"),
])
def test_bad_input_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        where: str, model, message: str) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / where
    if where == "a file":
        folder.write_text("")
    elif where == "no pictures":
        folder.mkdir()
        (folder / "notes.txt").write_text("")
    elif where == "ok":
        write_image(folder / "a.png")
    monkeypatch.setenv("AITK_STATUS_FILE", str(tmp_path / "status.json"))
    extra = model(tmp_path, monkeypatch) if model else []
    assert main([str(folder), *extra]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("aitk caption: error: "), lines
    assert re.search(message, lines[0]), lines[0]
    final = read_status(tmp_path / "status.json")
    assert final is not None and (final.phase, final.exit_code) == (Phase.FAILED, 2)
    assert final.error and final.error in lines[0]
    if where == "ok":
        assert not (folder / "a.txt").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--limit", "0"], "--limit 0"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--prompt", " "], "--prompt is empty"),
])
def test_bad_flags_are_one_line_and_exit_2(dataset: Path, capsys: pytest.CaptureFixture[str],
                                           argv: list[str], message: str) -> None:
    assert main([str(dataset), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err
    assert sorted(captions(dataset)) == ["b.txt"]


def test_cuda_asked_for_but_absent_is_one_line_and_exit_2(
        dataset: Path, tiny_vlm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert caption(dataset, tiny_vlm, "--device", "cuda") == 2
    assert "CUDA is not available here" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_the_command_after_the_current_file(tmp_path: Path,
                                                         tiny_vlm: Path) -> None:
    """The real process: SIGINT once a file is captioned; the next file finishes, the
    rest keep no caption, exit 130, the status file says stopped."""
    folder = tmp_path / "many pictures"
    for i in range(12):
        write_image(folder / f"p{i:02}.png", (64, 64), (20 * i, 30, 30))
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "AITK_STATUS_FILE": str(tmp_path / "status.json")}
    child = subprocess.Popen(
        [sys.executable, "-m", "aitk", "caption", str(folder), "--model", str(tiny_vlm),
         "--max-new-tokens", "96"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("captioned 1/12"):
            child.send_signal(signal.SIGINT)
            break
    out, err = child.communicate(timeout=300)
    assert child.returncode == 130, err
    written = sorted(p.name for p in folder.glob("*.txt"))
    assert 1 <= len(written) < 12 and no_temp_files(folder)
    assert f"stopped: captioned {len(written)} of 12" in out
    assert "stopping after the current file" in err and "Traceback" not in err
    final = read_status(tmp_path / "status.json")
    assert final is not None and (final.phase, final.exit_code) == (Phase.STOPPED, 130)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes anywhere; permissions need another user")
def test_a_read_only_dataset_is_refused_before_the_model_loads(
        dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset.chmod(0o555)
    try:
        assert main([str(dataset), "--model", str(dataset / "no such model")]) == 2
    finally:
        dataset.chmod(0o755)
    assert "is not writable" in capsys.readouterr().err
