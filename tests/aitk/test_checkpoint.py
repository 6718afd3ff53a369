"""Checkpoint directories: atomic publish, validation, resume choice, pruning, RNG."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from aitk.run import checkpoint as ckpt


def files(step: int) -> dict[str, bytes]:
    return {"adapter.safetensors": f"weights {step}".encode(),
            "optimizer.pt": f"optimizer {step}".encode(), "state.json": b'{"step": %d}' % step}


def test_save_publishes_a_complete_validated_directory(tmp_path: Path):
    saved = ckpt.save_checkpoint(tmp_path, 250, files(250))
    assert saved.path.name == "step_000000250"
    assert sorted(p.name for p in saved.path.iterdir()) == [
        "adapter.safetensors", "manifest.json", "optimizer.pt", "state.json"]
    assert ckpt.validate(saved.path).step == 250
    assert [p.name for p in tmp_path.iterdir()] == ["step_000000250"]  # no temp left


def test_crash_mid_write_leaves_the_previous_checkpoint_usable(tmp_path: Path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 10, files(10))
    real = ckpt._write_synced
    calls = {"n": 0}

    def crash_on_second_file(path, data):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # a second Ctrl+C, or the power going out
        real(path, data)

    monkeypatch.setattr(ckpt, "_write_synced", crash_on_second_file)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 20, files(20))
    monkeypatch.undo()
    assert not (tmp_path / "step_000000020").exists()
    found = ckpt.find_resumable(tmp_path, report=pytest.fail)
    assert found is not None and found.step == 10
    assert found.read("optimizer.pt") == b"optimizer 10"


def test_hard_kill_leftovers_are_never_resumed_and_are_cleaned(tmp_path: Path):
    ckpt.save_checkpoint(tmp_path, 10, files(10))
    torn = tmp_path / ".tmp-step_000000020-999"
    torn.mkdir()
    (torn / "adapter.safetensors").write_bytes(b"half")
    assert ckpt.find_resumable(tmp_path).step == 10
    ckpt.clean_stale(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["step_000000010"]


@pytest.mark.parametrize("damage", ["truncate", "delete_file", "delete_manifest",
                                    "garble_manifest"])
def test_corrupt_newest_is_skipped_and_reported(tmp_path: Path, damage: str):
    ckpt.save_checkpoint(tmp_path, 10, files(10))
    newest = ckpt.save_checkpoint(tmp_path, 20, files(20)).path
    if damage == "truncate":
        (newest / "optimizer.pt").write_bytes(b"opt")
    elif damage == "delete_file":
        (newest / "adapter.safetensors").unlink()
    elif damage == "delete_manifest":
        (newest / "manifest.json").unlink()
    else:
        (newest / "manifest.json").write_text("{not json")
    reports: list[str] = []
    found = ckpt.find_resumable(tmp_path, report=reports.append)
    assert found is not None and found.step == 10
    assert len(reports) == 1 and reports[0].startswith("skipping checkpoint step_000000020")


def test_no_checkpoint_means_a_fresh_start(tmp_path: Path):
    assert ckpt.find_resumable(tmp_path / "absent") is None


def test_prune_keeps_the_newest(tmp_path: Path):
    for step in (5, 10, 15, 20):
        ckpt.save_checkpoint(tmp_path, step, files(step))
    assert ckpt.prune(tmp_path, 2) == [10, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000015", "step_000000020"]


def test_resaving_a_step_replaces_it_whole(tmp_path: Path):
    ckpt.save_checkpoint(tmp_path, 10, files(10))
    again = ckpt.save_checkpoint(tmp_path, 10, {"adapter.safetensors": b"new"})
    assert ckpt.validate(again.path).step == 10
    assert sorted(p.name for p in again.path.iterdir()) == ["adapter.safetensors",
                                                             "manifest.json"]


def test_rng_state_round_trips_through_weights_only_load(tmp_path: Path):
    import io

    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    buf = io.BytesIO()
    torch.save(ckpt.capture_rng(), buf)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


# ---- only what the trainer wrote is removed; invalid checkpoints are set aside ---------
def test_invalid_newest_checkpoints_are_set_aside_so_pruning_keeps_the_valid_ones(
        tmp_path: Path):
    for step in (10, 20, 30):
        ckpt.save_checkpoint(tmp_path, step, files(step))
    for step in (20, 30):  # the newest two are damaged
        (tmp_path / ckpt.dir_name(step) / "optimizer.pt").write_bytes(b"torn")
    reports: list[str] = []
    found = ckpt.find_resumable(tmp_path, report=reports.append)
    assert found is not None and found.step == 10
    assert [r.split(";")[1] for r in reports] == [" set aside as invalid-step_000000030",
                                                  " set aside as invalid-step_000000020"]
    # The resumed run saves 11 and 12 with keep=2: the valid 10 is pruned only for them,
    # and the set-aside ones are never counted nor deleted.
    for step in (11, 12):
        ckpt.save_checkpoint(tmp_path, step, files(step))
        ckpt.prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "invalid-step_000000020", "invalid-step_000000030", "step_000000011",
        "step_000000012"]
    assert [p.name for p in ckpt.set_aside_earlier(tmp_path)] == [
        "invalid-step_000000020", "invalid-step_000000030"]


def test_setting_aside_twice_keeps_both(tmp_path: Path):
    for _ in range(2):
        (tmp_path / "step_000000020").mkdir()
        assert ckpt.find_resumable(tmp_path, report=lambda m: None) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["invalid-step_000000020",
                                                          "invalid-step_000000020-2"]


def test_cleanup_and_pruning_leave_folders_the_trainer_did_not_write(tmp_path: Path):
    user = {".old-photos": "a.jpg", ".tmp-x": "notes.txt", "step_1": "mine.txt",
            ".tmp-step_000000020-999": "photo.jpg", "step_000000002": "mine.txt"}
    for folder, name in user.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("the user's")
    for step in (5, 10):
        ckpt.save_checkpoint(tmp_path, step, files(step))
    ckpt.clean_stale(tmp_path)
    assert ckpt.prune(tmp_path, 1) == [5]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*user, "step_000000010"])
    assert all((tmp_path / f / n).read_text() == "the user's" for f, n in user.items())
