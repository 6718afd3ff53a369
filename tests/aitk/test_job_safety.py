"""What a run may touch and how it fails: only its own files, never a silent restart
from 0, a read-only cache, a full disk, file modes, the --name option."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aitk.cli.run import main as cli_main
from aitk.config.loading import load_config
from aitk.errors import EXIT_FAILED, EXIT_INPUT, EXIT_OK
from aitk.run import checkpoint as ckpt
from aitk.run.job import run_job
from tests.aitk.aitk_testing import REPO, job_config, write_config

pytestmark = pytest.mark.slow


def quick(tmp_path: Path, model_dir: Path, name: str = "job", steps: int = 4,
          **overrides) -> Path:
    """A short job (no previews) saving at steps 2 and 4, keeping one."""
    defaults = {"train": {"disable_sampling": True},
                "save": {"save_every": 2, "max_step_saves_to_keep": 1}}
    overrides = {k: {**defaults.get(k, {}), **overrides.get(k, {})}
                 for k in {*defaults, *overrides}}
    cfg = job_config(name, tmp_path / "out", model_dir, steps=steps, **overrides)
    return write_config(tmp_path / f"{name}.yml", cfg)


def run(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = run_job(load_config(str(path)))
    return code, capsys.readouterr().err


# ---- checkpoints that all fail validation --------------------------------------------
def test_when_no_checkpoint_validates_the_run_stops_instead_of_restarting_at_0(
        tmp_path: Path, example_model_dir: Path, capsys):
    path = quick(tmp_path, example_model_dir, save={"max_step_saves_to_keep": 2})
    assert run(path, capsys)[0] == EXIT_OK
    root = tmp_path / "out" / "job" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_000000002", "step_000000004"]
    for p in root.iterdir():
        (p / "adapter.safetensors").write_bytes(b"bit rot")
    cfg = yaml.safe_load(path.read_text())
    cfg["config"]["process"][0]["train"]["steps"] = 8
    write_config(path, cfg)

    code, err = run(path, capsys)
    assert code == EXIT_INPUT and "Traceback" not in err
    assert "skipping checkpoint step_000000004: adapter.safetensors does not match its " \
           "checksum; set aside as invalid-step_000000004" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: no checkpoint in {root} validates; set aside (renamed, "
                           "not deleted): invalid-step_000000002, invalid-step_000000004")
    assert "move or delete those folders" in last
    # Nothing deleted, nothing trained, and running again still refuses.
    assert sorted(p.name for p in root.iterdir()) == ["invalid-step_000000002",
                                                      "invalid-step_000000004"]
    assert run(path, capsys)[0] == EXIT_INPUT
    # The documented way to start fresh.
    for p in root.iterdir():
        p.rename(tmp_path / p.name)
    assert run(path, capsys)[0] == EXIT_OK


# ---- only the trainer's own files are removed or overwritten -------------------------
def test_a_run_in_an_existing_folder_leaves_the_users_files_alone(tmp_path: Path,
                                                                  example_model_dir: Path,
                                                                  capsys):
    out = tmp_path / "out" / "job"
    mine = {".old-photos/a.jpg", "checkpoints/.tmp-x/notes.txt", "checkpoints/step_1/a.txt",
            "checkpoints/.old-step_000000002-7/photo.jpg", "config.yaml", "notes.txt",
            "job_notes.safetensors"}
    for rel in mine:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(f"the user's {rel}")
    path = quick(tmp_path, example_model_dir)
    code, err = run(path, capsys)
    assert code == EXIT_OK, err
    assert all((out / rel).read_text() == f"the user's {rel}" for rel in mine)
    assert f"{out / 'config.yaml'} was not written by aitk; left as it is" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        ".old-step_000000002-7", ".tmp-x", "step_000000004", "step_1"]


def test_config_yaml_written_by_aitk_is_rewritten(tmp_path: Path, example_model_dir: Path,
                                                  capsys):
    path = quick(tmp_path, example_model_dir, steps=2)
    assert run(path, capsys)[0] == EXIT_OK
    written = tmp_path / "out" / "job" / "config.yaml"
    assert written.read_text().startswith("# the config as run, written by aitk")
    cfg = yaml.safe_load(path.read_text())
    cfg["config"]["process"][0]["train"]["steps"] = 3
    write_config(path, cfg)
    assert run(path, capsys)[0] == EXIT_OK
    assert yaml.safe_load(written.read_text())["config"]["process"][0]["train"]["steps"] == 3


def test_a_lora_file_the_trainer_did_not_write_is_never_overwritten(tmp_path: Path,
                                                                    example_model_dir: Path,
                                                                    capsys):
    out = tmp_path / "out" / "job"
    out.mkdir(parents=True)
    (out / "job.safetensors").write_bytes(b"someone else's LoRA")
    code, err = run(quick(tmp_path, example_model_dir, steps=2), capsys)
    assert code == EXIT_INPUT and "Traceback" not in err
    assert f"{out / 'job.safetensors'} was not written by aitk" in err
    assert (out / "job.safetensors").read_bytes() == b"someone else's LoRA"


# ---- a read-only cache folder --------------------------------------------------------
def test_an_unwritable_cache_folder_does_not_stop_training(tmp_path: Path,
                                                           example_model_dir: Path,
                                                           monkeypatch, capsys):
    # Tests run as root, where chmod stops no write: a path under a regular file can
    # never be created, whoever asks (test_read_only_checkout_... below mounts one).
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("AITK_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    code, err = run(quick(tmp_path, example_model_dir, steps=2), capsys)
    assert code == EXIT_OK, err
    assert f"cache folder {tmp_path / 'a-file' / 'cache'} is not writable" in err
    assert (tmp_path / "out" / "job" / "job.safetensors").exists()


def unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare -rm` (user namespaces)")
def test_read_only_checkout_trains_with_caches_in_memory(tmp_path: Path,
                                                         example_model_dir: Path):
    """The checkout bind-mounted read-only in a private mount namespace (root can write
    through chmod, not through a read-only mount): default cache <checkout>/cache."""
    path = quick(tmp_path, example_model_dir, steps=2)
    env = {k: v for k, v in os.environ.items() if k != "AITK_CACHE_DIR"}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    script = f'mount --bind -o ro "{REPO}" "{REPO}" && exec "{sys.executable}" run.py "{path}"'
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == EXIT_OK, done.stderr
    assert f"cache folder {REPO / 'cache'} is not writable" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "out" / "job" / "job.safetensors").exists()


# ---- a full disk -----------------------------------------------------------------------
def test_disk_full_during_a_save_is_one_message_and_keeps_the_last_checkpoint(
        tmp_path: Path, example_model_dir: Path, monkeypatch, capsys):
    real = ckpt._write_synced
    saves = {"n": 0}

    def fill_on_second_save(target: Path, data: bytes) -> None:
        if target.name == "adapter.safetensors":
            saves["n"] += 1
        if saves["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        real(target, data)

    monkeypatch.setattr(ckpt, "_write_synced", fill_on_second_save)
    code, err = run(quick(tmp_path, example_model_dir), capsys)
    assert code == EXIT_FAILED and "Traceback" not in err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(
        f"error: not enough disk space in {tmp_path / 'out' / 'job' / 'checkpoints'} "
        "(needs about ")
    assert "MiB free); the last saved checkpoint is kept" in lines[0]
    root = tmp_path / "out" / "job" / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["step_000000002"]
    ckpt.validate(root / "step_000000002")


def test_free_space_is_checked_before_a_save(tmp_path: Path, example_model_dir: Path,
                                             monkeypatch, capsys):
    import shutil

    from aitk_common import files

    real = shutil.disk_usage

    def almost_full(path):
        return real(path)._replace(free=1024)

    monkeypatch.setattr(files.shutil, "disk_usage", almost_full)
    code, err = run(quick(tmp_path, example_model_dir), capsys)
    assert code == EXIT_FAILED and "Traceback" not in err
    assert f"error: not enough disk space in {tmp_path / 'out' / 'job'} (needs about " in err
    # The check keeps a margin beyond the save's size: the line says so, with its size.
    assert "plus a 10% + 16.0 MiB safety margin, 0.0 MiB free)" in err
    assert not (tmp_path / "out" / "job" / "checkpoints").exists()  # nothing half-written


# ---- file modes follow the umask -------------------------------------------------------
def test_outputs_follow_the_umask(tmp_path: Path, example_model_dir: Path):
    path = quick(tmp_path, example_model_dir, steps=2,
                 sample={"sample_every": 2}, train={"disable_sampling": False})
    done = subprocess.run([sys.executable, str(REPO / "run.py"), str(path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, umask=0o022,
                          env={**os.environ, "AITK_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    found = [p for root in (tmp_path / "out", tmp_path / "cache") for p in root.rglob("*")]
    assert any(p.suffix == ".png" for p in found) and any(p.parent.name == "latents"
                                                          or p.suffix == ".safetensors"
                                                          for p in found)
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in found}
    wrong = {p: m for p, m in modes.items()
             if m != ("0o755" if (tmp_path / p).is_dir() else "0o644")}
    assert not wrong


# ---- --name ----------------------------------------------------------------------------
def test_name_option_names_outputs_even_when_the_config_has_a_name(tmp_path: Path,
                                                                   example_model_dir: Path,
                                                                   capsys):
    path = quick(tmp_path, example_model_dir, name="own_name", steps=2)
    assert cli_main([str(path), "--name", "run1"]) == EXIT_OK
    out = tmp_path / "out"
    assert [p.name for p in out.iterdir()] == ["run1"]
    assert (out / "run1" / "run1.safetensors").exists()
    assert json.loads((out / "run1" / "checkpoints" / "step_000000002" / "state.json")
                      .read_text())["name"] == "run1"


# ---- leftovers of an interrupted save ------------------------------------------------
def _torn_lora(path: Path, software: str) -> None:
    """What a save killed mid-write leaves: the safetensors header, part of the data."""
    import torch
    from safetensors.torch import save

    data = save({"w": torch.zeros(4096)},
                metadata={"software": json.dumps({"name": software, "version": "0"})})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:len(data) // 2])


def test_temp_files_of_an_interrupted_lora_save_are_removed_at_the_next_start(
        tmp_path: Path, example_model_dir: Path, capsys):
    """A kill -9 (or power loss) during a LoRA write leaves its atomic writer's temp
    file. The next start removes it when its header says aitk wrote it, and leaves any
    other file at such a name."""
    out = tmp_path / "out" / "job"
    ours = [out / ".job_000000002.safetensors.k3x9_a1b.tmp",
            out / ".job.safetensors.q0w8e7r6.tmp"]
    for path in ours:
        _torn_lora(path, "aitk")
    theirs = [out / ".job_000000002.safetensors.zzzz9999.tmp",  # another program's header
              out / ".job.safetensors.abcdefgh.tmp",  # not safetensors at all
              out / ".notes.txt.abcdefgh.tmp"]  # not a LoRA's name
    _torn_lora(theirs[0], "kohya")
    theirs[1].write_bytes(b"my own notes")
    theirs[2].write_bytes(b"more notes")
    code, err = run(quick(tmp_path, example_model_dir, steps=2), capsys)
    assert code == EXIT_OK, err
    assert not any(p.exists() for p in ours)
    assert all(p.exists() for p in theirs)
    assert "removed 2 temp files of an interrupted save" in err
