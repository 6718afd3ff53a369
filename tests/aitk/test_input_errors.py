"""A user's input error is one line and exit 2, never a traceback: `run.py --check`
finds what it can without weights, and the run says the rest in one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from aitk.cli.run import main
from aitk.errors import EXIT_INPUT
from tests.aitk.aitk_testing import job_config, write_config


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if "error" in line]


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None,
                    reason="flash-attn is installed here")
def test_an_attention_backend_that_is_not_installed_is_one_line_exit_2(
        tmp_path: Path, example_model_dir: Path, capsys) -> None:
    cfg = job_config("attn", tmp_path / "out", example_model_dir, steps=2,
                     model={"model_kwargs": {"attention_backend": "flash"}})
    assert main([str(write_config(tmp_path / "c.yml", cfg))]) == EXIT_INPUT
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "needs the flash-attn package" in lines[0], lines


def test_check_finds_a_misspelt_model_kwarg_before_loading(tmp_path: Path,
                                                           example_model_dir: Path,
                                                           capsys) -> None:
    cfg = job_config("attn", tmp_path / "out", example_model_dir, steps=2,
                     model={"model_kwargs": {"attention_backend": "flsh"}})
    assert main([str(write_config(tmp_path / "c.yml", cfg)), "--check"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "config.process[0].model.model_kwargs.attention_backend" in err, err


@pytest.mark.parametrize("how", ["config", "--name"])
@pytest.mark.parametrize("check", [True, False])
def test_a_300_character_job_name_is_one_line_exit_2(tmp_path: Path,
                                                     example_model_dir: Path, capsys,
                                                     how: str, check: bool) -> None:
    """The name becomes a folder and file names (`NAME_000000250.safetensors`), which
    filesystems hold to 255 bytes."""
    long = "n" * 300
    cfg = job_config(long if how == "config" else "short", tmp_path / "out",
                     example_model_dir, steps=2)
    argv = [str(write_config(tmp_path / "c.yml", cfg))]
    argv += ["--name", long] if how == "--name" else []
    assert main(argv + (["--check"] if check else [])) == EXIT_INPUT
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "config.name" in lines[0] and "bytes" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_malformed_cuda_device_is_an_error_on_any_machine(tmp_path: Path,
                                                            example_model_dir: Path,
                                                            capsys) -> None:
    """`cuda:abc` would crash int() on a machine with CUDA; it is refused by its form."""
    cfg = job_config("dev", tmp_path / "out", example_model_dir, device="cuda:abc")
    assert main([str(write_config(tmp_path / "c.yml", cfg)), "--check"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unknown device 'cuda:abc'" in err, err


def test_a_log_file_that_cannot_be_written_is_one_line_exit_2(tmp_path: Path,
                                                               example_model_dir: Path,
                                                               capsys) -> None:
    cfg = write_config(tmp_path / "c.yml", job_config("log", tmp_path / "out",
                                                      example_model_dir))
    (tmp_path / "a-file").write_text("")
    assert main([str(cfg), "--check", "--log", str(tmp_path / "a-file" / "x.log")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "cannot write the log file" in lines[0], lines


def _dataset(tmp_path: Path) -> Path:
    import shutil

    from tests.aitk.aitk_testing import REPO

    folder = tmp_path / "data"
    shutil.copytree(REPO / "datasets" / "example", folder)
    return folder


def test_a_dataset_entry_that_cannot_be_looked_at_is_skipped_not_a_traceback(
        tmp_path: Path, example_model_dir: Path, monkeypatch, capsys) -> None:
    """A folder entry whose stat fails (permissions, a mount that went away) is reported
    by the preflight and skipped; the other pictures train."""
    folder = _dataset(tmp_path)
    (folder / "locked.png").write_bytes(b"")
    real = Path.is_file

    def is_file(self: Path) -> bool:
        if self.name == "locked.png":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    cfg = job_config("ds", tmp_path / "out", example_model_dir,
                     datasets=[{"folder_path": str(folder), "resolution": [32]}])
    assert main([str(write_config(tmp_path / "c.yml", cfg)), "--check"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "locked.png" in err, err


def test_a_dataset_folder_that_cannot_be_listed_is_one_line_exit_2(
        tmp_path: Path, example_model_dir: Path, monkeypatch, capsys) -> None:
    folder = _dataset(tmp_path)
    real = Path.iterdir

    def iterdir(self: Path):
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    cfg = job_config("ds", tmp_path / "out", example_model_dir,
                     datasets=[{"folder_path": str(folder), "resolution": [32]}])
    assert main([str(write_config(tmp_path / "c.yml", cfg)), "--check"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"cannot list {folder}" in err, err
